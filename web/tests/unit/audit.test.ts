import { describe, expect, it } from "vitest";

import { appendPage, decisionTone, filterByKind, isAlarming } from "@/lib/audit";

describe("audit badges", () => {
  it("alarms on every egress decision but allow", () => {
    expect(isAlarming({ kind: "egress", decision: "allow" })).toBe(false);
    for (const decision of ["deny_host", "no_credential", "deny_ip_literal", "credential_error", "something_new"]) {
      expect(isAlarming({ kind: "egress", decision })).toBe(true);
      expect(decisionTone({ kind: "egress", decision })).toBe("danger");
    }
    expect(decisionTone({ kind: "egress", decision: "allow" })).toBe("ok");
  });

  it("never alarms on admin or auth events", () => {
    expect(isAlarming({ kind: "admin", decision: "profile_delete" })).toBe(false);
    expect(isAlarming({ kind: "auth", decision: "login_failed" })).toBe(false);
    expect(decisionTone({ kind: "auth", decision: "login_failed" })).toBe("warn");
    expect(decisionTone({ kind: "admin", decision: "profile_create" })).toBe("neutral");
  });
});

describe("kind filter and paging", () => {
  const events = [
    { id: 5, kind: "egress" as const },
    { id: 4, kind: "auth" as const },
    { id: 3, kind: "admin" as const },
  ];

  it("filters client-side; no selection shows everything", () => {
    expect(filterByKind(events, new Set())).toEqual(events);
    expect(filterByKind(events, new Set(["auth", "admin"] as const)).map((e) => e.id)).toEqual([4, 3]);
  });

  it("appends a page without repeating events", () => {
    expect(appendPage(events, [{ id: 3, kind: "admin" }, { id: 2, kind: "auth" }]).map((e) => e.id)).toEqual([5, 4, 3, 2]);
  });
});
