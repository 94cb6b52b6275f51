"use client";

import { useFormatter, useTranslations } from "next-intl";

import { Badge } from "@/components/ui/badge";
import type { AuditEvent } from "@/lib/api/types";
import { decisionTone, isAlarming, kindTone } from "@/lib/audit";
import { cn } from "@/lib/cn";

/** Audit events as a table with kind and decision badges (it scrolls sideways on a phone). */
export function AuditTable({
  events,
  compact = false,
  showUser = false,
}: {
  events: readonly AuditEvent[];
  compact?: boolean;
  /** Admins see every user's events: show whose each one is (the user id; 0 = none). */
  showUser?: boolean;
}) {
  const t = useTranslations("audit");
  const format = useFormatter();
  return (
    <div className="overflow-x-auto">
      <table className="w-full text-left text-sm" data-testid="audit-table">
        <thead className="text-xs uppercase text-muted-foreground">
          <tr>
            <th scope="col" className="px-2 py-2 font-medium">{t("columns.time")}</th>
            {showUser ? <th scope="col" className="px-2 py-2 font-medium">{t("columns.user")}</th> : null}
            <th scope="col" className="px-2 py-2 font-medium">{t("columns.kind")}</th>
            <th scope="col" className="px-2 py-2 font-medium">{t("columns.decision")}</th>
            <th scope="col" className="px-2 py-2 font-medium">{t("columns.server")}</th>
            {compact ? null : <th scope="col" className="px-2 py-2 font-medium">{t("columns.host")}</th>}
            <th scope="col" className="px-2 py-2 font-medium">{t("columns.detail")}</th>
          </tr>
        </thead>
        <tbody>
          {events.map((event) => {
            const alarm = isAlarming(event);
            return (
              <tr
                key={event.id}
                data-testid="audit-row"
                data-event-id={event.id}
                data-kind={event.kind}
                data-alarm={alarm ? "true" : undefined}
                className={cn("border-t align-top", alarm && "bg-danger-muted")}
              >
                <td className="whitespace-nowrap px-2 py-2 text-muted-foreground">
                  <time dateTime={event.ts}>
                    {format.dateTime(new Date(event.ts), { dateStyle: "short", timeStyle: "medium" })}
                  </time>
                </td>
                {showUser ? (
                  <td className="px-2 py-2 font-mono text-xs" data-testid="audit-user">
                    {event.user_id || "—"}
                  </td>
                ) : null}
                <td className="px-2 py-2">
                  <Badge tone={kindTone(event.kind)}>{t(`kinds.${event.kind}`)}</Badge>
                </td>
                <td className="px-2 py-2">
                  <Badge tone={decisionTone(event)}>
                    {alarm ? <span aria-hidden="true" className="mr-1">⚠</span> : null}
                    {event.decision}
                  </Badge>
                </td>
                <td className="px-2 py-2 font-mono text-xs">{event.server || "—"}</td>
                {compact ? null : <td className="px-2 py-2 font-mono text-xs">{event.host || "—"}</td>}
                <td className="max-w-xs break-words px-2 py-2 text-xs text-muted-foreground">{event.detail}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}
