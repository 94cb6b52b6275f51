import type { BadgeTone } from "@/components/ui/badge";
import type { AuditEvent, AuditKind } from "@/lib/api/types";

export const AUDIT_KINDS: readonly AuditKind[] = ["egress", "auth", "admin"];

/** An egress decision other than `allow` is an alarm (SPEC); a failed sign-in a warning. */
export function isAlarming(event: Pick<AuditEvent, "kind" | "decision">): boolean {
  return event.kind === "egress" && event.decision !== "allow";
}

export function decisionTone(event: Pick<AuditEvent, "kind" | "decision">): BadgeTone {
  if (isAlarming(event)) return "danger";
  if (event.kind === "egress") return "ok";
  if (event.kind === "auth" && event.decision.endsWith("_failed")) return "warn";
  if (event.decision === "tool_withheld") return "warn";
  return "neutral";
}

export function kindTone(kind: AuditKind): BadgeTone {
  return kind === "egress" ? "info" : "neutral";
}

/** Client-side kind filter (the API has none): an empty selection shows everything. */
export function filterByKind<E extends Pick<AuditEvent, "kind">>(events: readonly E[], kinds: ReadonlySet<AuditKind>): E[] {
  return kinds.size === 0 ? [...events] : events.filter((event) => kinds.has(event.kind));
}

/** Appends a page, dropping ids already shown (a page may overlap after new events). */
export function appendPage<E extends Pick<AuditEvent, "id">>(shown: readonly E[], page: readonly E[]): E[] {
  const seen = new Set(shown.map((event) => event.id));
  return [...shown, ...page.filter((event) => !seen.has(event.id))];
}
