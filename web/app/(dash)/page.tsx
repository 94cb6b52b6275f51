"use client";

import Link from "next/link";
import { useTranslations } from "next-intl";

import { AuditTable } from "@/components/audit-table";
import { useSession } from "@/components/session";
import { Card, CardHeader } from "@/components/ui/card";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton, Skeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import { useResource } from "@/lib/use-resource";

const RECENT = 10;

function Count({ label, value, href, testId }: { label: string; value: number | undefined; href: string; testId: string }) {
  return (
    <Link href={href} className="rounded-lg border bg-card p-4 shadow-sm hover:bg-accent focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring">
      <p className="text-sm text-muted-foreground">{label}</p>
      {value === undefined ? (
        <Skeleton className="mt-2 h-8 w-12" />
      ) : (
        <p className="mt-1 text-3xl font-semibold" data-testid={testId}>
          {value}
        </p>
      )}
    </Link>
  );
}

export default function OverviewPage() {
  const t = useTranslations("overview");
  const { isAdmin, me } = useSession();
  const userKey = me.user.id;
  const counts = useResource(
    async (signal) => {
      const [profiles, servers, credentials, users] = await Promise.all([
        api.profiles(signal),
        api.servers(signal),
        api.credentials(signal),
        isAdmin ? api.users(signal) : Promise.resolve(undefined),
      ]);
      return { profiles: profiles.length, servers: servers.length, credentials: credentials.length, users: users?.length };
    },
    [isAdmin, userKey],
  );
  const recent = useResource((signal) => api.audit({ limit: RECENT }, signal), [userKey]);

  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      {counts.error ? (
        <ErrorState error={counts.error} onRetry={counts.reload} />
      ) : (
        <div className="grid grid-cols-2 gap-3 md:grid-cols-4">
          <Count label={t("counts.profiles")} value={counts.data?.profiles} href="/profiles" testId="count-profiles" />
          <Count label={t("counts.servers")} value={counts.data?.servers} href="/servers" testId="count-servers" />
          <Count label={t("counts.credentials")} value={counts.data?.credentials} href="/credentials" testId="count-credentials" />
          {isAdmin ? <Count label={t("counts.users")} value={counts.data?.users} href="/users" testId="count-users" /> : null}
        </div>
      )}
      <Card className="mt-6">
        <CardHeader
          title={t("recent")}
          actions={
            <Link href="/audit" className="text-sm text-primary underline-offset-4 hover:underline">
              {t("viewAll")}
            </Link>
          }
        />
        {recent.error ? (
          <ErrorState error={recent.error} onRetry={recent.reload} />
        ) : recent.data === undefined ? (
          <ListSkeleton rows={4} label={t("recent")} />
        ) : recent.data.events.length === 0 ? (
          <EmptyState title={t("noActivity")}>{t("noActivityHint")}</EmptyState>
        ) : (
          <AuditTable events={recent.data.events} compact />
        )}
      </Card>
    </>
  );
}
