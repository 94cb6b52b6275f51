"use client";

import { useTranslations } from "next-intl";
import { useState } from "react";

import { InstallForm } from "@/components/servers/install-form";
import { useSession } from "@/components/session";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { ConfirmDialog } from "@/components/ui/confirm";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState, InlineError } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import { useResource } from "@/lib/use-resource";

type Removal =
  | { kind: "idle" }
  | { kind: "done"; name: string }
  | { kind: "failed"; name: string; error: unknown }
  | { kind: "notConfigured" };

export default function ServersPage() {
  const t = useTranslations("servers");
  const common = useTranslations("common");
  const { isAdmin, readOnly } = useSession();
  const servers = useResource((signal) => api.servers(signal));
  const [target, setTarget] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [removal, setRemoval] = useState<Removal>({ kind: "idle" });

  async function uninstall() {
    if (target === null) return;
    const name = target;
    setBusy(true);
    try {
      await api.uninstallServer(name);
      setRemoval({ kind: "done", name });
      servers.reload();
    } catch (error) {
      if (error instanceof ApiError && (error.code === "not_configured" || error.status === 501)) {
        setRemoval({ kind: "notConfigured" });
      } else {
        setRemoval({ kind: "failed", name, error });
      }
    }
    setBusy(false);
    setTarget(null);
  }

  const list = servers.data;
  let body;
  if (servers.error && list === undefined) {
    body = <ErrorState error={servers.error} onRetry={servers.reload} />;
  } else if (list === undefined) {
    body = <ListSkeleton rows={3} label={common("loading")} />;
  } else if (list.length === 0) {
    body = <EmptyState title={t("list.empty")}>{isAdmin ? t("list.emptyAdmin") : t("list.emptyUser")}</EmptyState>;
  } else {
    body = (
      <ul className="divide-y rounded-md border" data-testid="server-list">
        {list.map((server) => (
          <li
            key={server.id}
            data-testid="server-row"
            data-server={server.name}
            className="flex flex-wrap items-center justify-between gap-2 px-3 py-2"
          >
            <span className="min-w-0 break-all font-mono text-sm font-medium">{server.name}</span>
            {isAdmin ? (
              <MutationButton
                variant="secondary"
                size="sm"
                data-testid="uninstall"
                aria-label={t("uninstall.buttonLabel", { name: server.name })}
                disabled={busy}
                onClick={() => {
                  setRemoval({ kind: "idle" });
                  setTarget(server.name);
                }}
              >
                {t("uninstall.button")}
              </MutationButton>
            ) : null}
          </li>
        ))}
      </ul>
    );
  }

  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      {isAdmin ? <InstallForm readOnly={readOnly} onInstalled={servers.reload} /> : null}
      <Card>
        <CardHeader
          title={t("list.title")}
          description={
            isAdmin ? undefined : <span data-testid="servers-read-only-note">{t("list.readOnlyNote")}</span>
          }
          actions={
            list !== undefined ? (
              <span className="text-sm text-muted-foreground" data-testid="server-count">
                {t("list.count", { count: list.length })}
              </span>
            ) : undefined
          }
        />
        <div aria-live="polite">
          {removal.kind === "done" ? (
            <p className="mb-3 text-sm text-ok" data-testid="uninstall-done">
              {t("uninstall.done", { name: removal.name })}
            </p>
          ) : null}
          {removal.kind === "failed" ? (
            <div className="mb-3 rounded-md border border-danger bg-danger-muted p-3 text-sm" data-testid="uninstall-error">
              <p className="font-medium">{t("uninstall.failed", { name: removal.name })}</p>
              <InlineError error={removal.error} />
              {removal.error instanceof ApiError && removal.error.code === "uninstall_failed" ? (
                <p className="mt-1 text-muted-foreground">{t("uninstall.retryHint")}</p>
              ) : null}
            </div>
          ) : null}
          {removal.kind === "notConfigured" ? (
            <div data-testid="not-configured" className="mb-3 rounded-md border bg-muted p-3 text-sm">
              <p className="font-medium">{t("install.notConfiguredTitle")}</p>
              <p className="mt-1 text-muted-foreground">{t("install.notConfigured")}</p>
            </div>
          ) : null}
        </div>
        {servers.error && list !== undefined ? (
          <div className="mb-3">
            <ErrorState error={servers.error} onRetry={servers.reload} />
          </div>
        ) : null}
        {body}
      </Card>
      <ConfirmDialog
        open={target !== null}
        onOpenChange={(open) => {
          if (!open && !busy) setTarget(null);
        }}
        title={t("uninstall.title", { name: target ?? "" })}
        description={t("uninstall.description", { name: target ?? "" })}
        confirmLabel={busy ? t("uninstall.busy") : t("uninstall.confirm")}
        onConfirm={() => void uninstall()}
        busy={busy}
      />
    </>
  );
}
