"use client";

import { useRouter } from "next/navigation";
import { useTranslations } from "next-intl";
import { useState } from "react";

import { useSession } from "@/components/session";
import { Badge } from "@/components/ui/badge";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState, InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { User } from "@/lib/api/types";
import { useResource } from "@/lib/use-resource";

export default function UsersPage() {
  const t = useTranslations("users");
  const { isAdmin } = useSession();
  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      {isAdmin ? (
        <UserList />
      ) : (
        <EmptyState title={t("forbidden")}>{t("forbiddenHint")}</EmptyState>
      )}
    </>
  );
}

function UserList() {
  const t = useTranslations("users");
  const common = useTranslations("common");
  const router = useRouter();
  const session = useSession();
  const { me } = session;
  const realId = (me.real_user ?? me.user).id;
  const users = useResource((signal) => api.users(signal));
  const [starting, setStarting] = useState<number | null>(null);
  const [error, setError] = useState<unknown>(null);

  async function viewAs(user: User) {
    setStarting(user.id);
    setError(null);
    try {
      await api.startViewAs(user.id, 60);
      session.reload();
      router.push("/");
    } catch (cause) {
      setError(cause);
      setStarting(null);
    }
  }

  if (users.error && users.data === undefined) {
    return <ErrorState error={users.error} onRetry={users.reload} />;
  }
  if (users.data === undefined) {
    return <ListSkeleton rows={4} label={common("loading")} />;
  }
  if (users.data.length === 0) {
    return <EmptyState title={t("empty")}>{t("emptyHint")}</EmptyState>;
  }
  return (
    <Card>
      <CardHeader
        title={t("count", { count: users.data.length })}
        description={t("viewAsHint")}
      />
      {error ? (
        <div className="mb-3" data-testid="view-as-error">
          <InlineError error={error} />
        </div>
      ) : null}
      <div className="overflow-x-auto">
        <table className="w-full text-left text-sm" data-testid="user-table">
          <thead className="text-xs uppercase text-muted-foreground">
            <tr>
              <th scope="col" className="px-2 py-2 font-medium">{t("columns.name")}</th>
              <th scope="col" className="px-2 py-2 font-medium">{t("columns.email")}</th>
              <th scope="col" className="px-2 py-2 font-medium">{t("columns.role")}</th>
              <th scope="col" className="px-2 py-2 font-medium">
                <span className="sr-only">{t("columns.actions")}</span>
              </th>
            </tr>
          </thead>
          <tbody>
            {users.data.map((user) => {
              const name = user.display_name || user.email;
              const self = user.id === realId;
              return (
                <tr key={user.id} data-testid="user-row" data-user-id={user.id} className="border-t align-middle">
                  <th scope="row" className="px-2 py-2 font-medium">
                    <span className="break-words">{user.display_name || "—"}</span>
                    {self ? (
                      <Badge className="ml-2" data-testid="user-self">
                        {t("you")}
                      </Badge>
                    ) : null}
                  </th>
                  <td className="break-all px-2 py-2 text-muted-foreground">{user.email}</td>
                  <td className="px-2 py-2">
                    <Badge tone={user.role === "admin" ? "info" : "neutral"} data-testid="user-role" data-role={user.role}>
                      {common(`roles.${user.role}`)}
                    </Badge>
                  </td>
                  <td className="whitespace-nowrap px-2 py-2 text-right">
                    {self ? null : (
                      <MutationButton
                        variant="secondary"
                        size="sm"
                        data-testid="view-as"
                        aria-label={t("viewAsLabel", { name })}
                        disabled={starting !== null}
                        onClick={() => void viewAs(user)}
                      >
                        {starting === user.id ? t("starting") : t("viewAs")}
                      </MutationButton>
                    )}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
    </Card>
  );
}
