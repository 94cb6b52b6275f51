"use client";

import { useTranslations } from "next-intl";
import { useId, useState } from "react";

import { AuditTable } from "@/components/audit-table";
import { useSession } from "@/components/session";
import { Button } from "@/components/ui/button";
import { Card } from "@/components/ui/card";
import { Chip } from "@/components/ui/chip";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState, InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { AuditEvent, AuditKind, AuditPage } from "@/lib/api/types";
import { appendPage, AUDIT_KINDS, filterByKind } from "@/lib/audit";
import { useResource } from "@/lib/use-resource";

import { UserFilter } from "./user-filter";

const PAGE_SIZE = 50;

export default function AuditLogPage() {
  const t = useTranslations("audit");
  const { isAdmin, readOnly, me } = useSession();
  const [kinds, setKinds] = useState<ReadonlySet<AuditKind>>(() => new Set());
  const [userId, setUserId] = useState<number | undefined>(undefined);
  const chipsLabel = useId();
  // The API honours `user_id` only for admins who are not viewing as someone.
  const canFilterUser = isAdmin && !readOnly;

  function toggle(kind: AuditKind) {
    setKinds((old) => {
      const next = new Set(old);
      if (next.has(kind)) next.delete(kind);
      else next.add(kind);
      return next;
    });
  }

  const viewed = me.user;
  const scope = readOnly
    ? t("scope.viewAs", { name: viewed.display_name || viewed.email })
    : isAdmin
      ? userId === undefined
        ? t("scope.all")
        : t("filter.activeUser", { id: userId })
      : t("scope.own");

  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      <Card className="mb-4">
        <p className="mb-3 text-sm text-muted-foreground" data-testid="audit-scope">
          {scope}
        </p>
        <div className="flex flex-col gap-4 md:flex-row md:items-start md:justify-between">
          <div>
            <p id={chipsLabel} className="text-sm font-medium">
              {t("filter.kinds")}
            </p>
            <div role="group" aria-labelledby={chipsLabel} className="mt-2 flex flex-wrap gap-2">
              {AUDIT_KINDS.map((kind) => (
                <Chip
                  key={kind}
                  pressed={kinds.has(kind)}
                  data-testid="kind-chip"
                  data-kind={kind}
                  onClick={() => toggle(kind)}
                >
                  {t(`kinds.${kind}`)}
                </Chip>
              ))}
              {kinds.size > 0 ? (
                <Button variant="ghost" size="sm" data-testid="kind-clear" onClick={() => setKinds(new Set())}>
                  {t("filter.allKinds")}
                </Button>
              ) : null}
            </div>
            <p className="mt-2 text-xs text-muted-foreground">{t("filter.kindsHint")}</p>
          </div>
          {canFilterUser ? <UserFilter value={userId} onChange={setUserId} /> : null}
        </div>
      </Card>
      {/* A new user filter starts a new log (first page, no appended pages). */}
      <AuditLog key={canFilterUser ? (userId ?? "all") : "own"} userId={canFilterUser ? userId : undefined} kinds={kinds} />
    </>
  );
}

interface Loaded {
  /** The first page these events extend; a reloaded first page starts over. */
  base: AuditPage;
  events: AuditEvent[];
  nextBefore: number;
}

function AuditLog({ userId, kinds }: { userId: number | undefined; kinds: ReadonlySet<AuditKind> }) {
  const { isAdmin, readOnly } = useSession();
  const t = useTranslations("audit");
  const common = useTranslations("common");
  const first = useResource((signal) => api.audit({ limit: PAGE_SIZE, user_id: userId }, signal));
  const [more, setMore] = useState<Loaded | null>(null);
  const [loadingMore, setLoadingMore] = useState(false);
  const [moreError, setMoreError] = useState<unknown>(null);

  if (first.data === undefined) {
    return first.error ? (
      <ErrorState error={first.error} onRetry={first.reload} />
    ) : (
      <ListSkeleton rows={6} label={common("loading")} />
    );
  }

  const base = first.data;
  const loaded: Loaded =
    more !== null && more.base === base ? more : { base, events: base.events, nextBefore: base.next_before };
  const shown = filterByKind(loaded.events, kinds);

  async function loadMore() {
    setLoadingMore(true);
    setMoreError(null);
    try {
      const page = await api.audit({ before: loaded.nextBefore, limit: PAGE_SIZE, user_id: userId });
      setMore({ base: loaded.base, events: appendPage(loaded.events, page.events), nextBefore: page.next_before });
    } catch (error) {
      setMoreError(error);
    }
    setLoadingMore(false);
  }

  if (loaded.events.length === 0) {
    return (
      <>
        {first.error ? <ErrorState error={first.error} onRetry={first.reload} /> : null}
        <EmptyState title={t("empty")}>{t("emptyHint")}</EmptyState>
      </>
    );
  }

  return (
    <Card>
      {first.error ? (
        <div className="mb-3">
          <ErrorState error={first.error} onRetry={first.reload} />
        </div>
      ) : null}
      <p className="mb-3 text-sm text-muted-foreground" role="status" data-testid="audit-count">
        {t("showing", { shown: shown.length, loaded: loaded.events.length })}
      </p>
      {shown.length === 0 ? (
        <EmptyState title={t("noMatch")}>{t("noMatchHint")}</EmptyState>
      ) : (
        <AuditTable events={shown} showUser={isAdmin && !readOnly} />
      )}
      <div className="mt-4 flex flex-col items-center gap-2">
        {moreError ? <InlineError error={moreError} /> : null}
        {loaded.nextBefore === 0 ? (
          <p className="text-sm text-muted-foreground" data-testid="end-of-log">
            {t("endOfLog")}
          </p>
        ) : (
          <Button variant="secondary" data-testid="load-more" disabled={loadingMore} onClick={() => void loadMore()}>
            {loadingMore ? t("loadingMore") : t("loadMore")}
          </Button>
        )}
      </div>
    </Card>
  );
}
