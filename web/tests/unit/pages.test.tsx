// @vitest-environment jsdom
import { act, cleanup, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { NextIntlClientProvider } from "next-intl";
import type { ReactNode } from "react";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import ServersPage from "@/app/(dash)/servers/page";
import UsersPage from "@/app/(dash)/users/page";
import AuditPage from "@/app/(dash)/audit/page";
import { SessionProvider, sessionFrom } from "@/components/session";
import { MESSAGES } from "@/i18n/messages";

const push = vi.fn();
vi.mock("next/navigation", () => ({
  usePathname: () => "/",
  useRouter: () => ({ replace: vi.fn(), push, refresh: vi.fn() }),
}));

const alice = { id: 1, email: "alice@example.test", display_name: "Alice Admin", role: "admin" as const };
const bob = { id: 2, email: "bob@example.test", display_name: "Bob User", role: "user" as const };

function respond(status: number, body?: unknown): Response {
  return body === undefined
    ? new Response(null, { status })
    : new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}
type Handler = (url: string, method: string, body: unknown) => Response;
let handler: Handler;
const calls: Array<{ url: string; method: string; body: unknown }> = [];
beforeEach(() => {
  calls.length = 0;
  push.mockReset();
  vi.stubGlobal("fetch", async (url: string, init?: RequestInit) => {
    const method = init?.method ?? "GET";
    const body = init?.body ? JSON.parse(String(init.body)) : undefined;
    calls.push({ url, method, body });
    return handler(url, method, body);
  });
});
afterEach(() => { cleanup(); vi.unstubAllGlobals(); });

const reload = vi.fn();
function wrap(ui: ReactNode, me: Parameters<typeof sessionFrom>[0], locale: "en" | "de" = "en") {
  return render(
    <NextIntlClientProvider locale={locale} messages={MESSAGES[locale]} timeZone="UTC">
      <SessionProvider value={sessionFrom(me, reload)}>{ui}</SessionProvider>
    </NextIntlClientProvider>,
  );
}

describe("servers", () => {
  it("installs, asks approval, uninstalls", async () => {
    let list = [{ id: 1, name: "memory" }];
    handler = (url, method, body) => {
      if (url === "/api/servers" && method === "GET") return respond(200, list);
      if (url === "/api/servers/install") {
        const b = body as { ref: string; approve_permissions?: boolean };
        if (b.ref === "github@2.0.0" && !b.approve_permissions)
          return respond(502, { error: { code: "install_failed", message: 'upgrading github from 1.0.0 to 2.0.0 widens its permissions: new egress host api.x; Nothing was changed; an admin can approve by repeating the install with "approve_permissions": true' } });
        if (b.ref === "nope") return respond(501, { error: { code: "not_configured", message: "no registry" } });
        list = [...list, { id: 2, name: "github" }];
        return respond(201, { id: 2, name: "github", version: "2.0.0", image: "x", image_digest: "sha256:0123456789abcdef0123" });
      }
      if (url === "/api/servers/memory" && method === "DELETE") { list = list.filter((s) => s.name !== "memory"); return respond(204); }
      return respond(404, { error: { code: "not_found", message: "no" } });
    };
    wrap(<ServersPage />, { user: alice, impersonating: false });
    await screen.findAllByTestId("server-row");
    const input = screen.getByLabelText("Registry reference");
    fireEvent.change(input, { target: { value: "Bad_Name" } });
    fireEvent.click(screen.getByTestId("install-submit"));
    expect(screen.getByRole("alert").textContent).toContain("name@version");
    fireEvent.change(input, { target: { value: "github@" } });
    fireEvent.click(screen.getByTestId("install-submit"));
    expect(screen.getByRole("alert")).toBeTruthy();
    fireEvent.change(input, { target: { value: "github@2.0.0" } });
    fireEvent.click(screen.getByTestId("install-submit"));
    await screen.findByTestId("install-approval");
    fireEvent.click(screen.getByTestId("install-approve"));
    const result = await screen.findByTestId("install-result");
    expect(result.textContent).toContain("github@2.0.0");
    expect(result.textContent).toContain("sha256:0123456789ab");
    expect(result.textContent).not.toContain("sha256:0123456789abc");
    await waitFor(() => expect(screen.getAllByTestId("server-row")).toHaveLength(2));
    expect(calls.filter((c) => c.url === "/api/servers/install").map((c) => c.body)).toEqual([
      { ref: "github@2.0.0" }, { ref: "github@2.0.0", approve_permissions: true },
    ]);
    fireEvent.change(input, { target: { value: "nope" } });
    fireEvent.click(screen.getByTestId("install-submit"));
    await screen.findByTestId("not-configured");

    const row = screen.getAllByTestId("server-row").find((r) => r.dataset.server === "memory")!;
    fireEvent.click(within(row).getByTestId("uninstall"));
    const dialog = await screen.findByRole("alertdialog");
    expect(dialog.textContent).toContain("every profile");
    fireEvent.click(within(dialog).getByRole("button", { name: "Uninstall" }));
    await waitFor(() => expect(screen.getAllByTestId("server-row")).toHaveLength(1));
    expect(screen.getByTestId("uninstall-done").textContent).toContain("memory");
  });

  it("read-only for users and disabled in view-as", async () => {
    handler = () => respond(200, [{ id: 1, name: "memory" }]);
    wrap(<ServersPage />, { user: bob, impersonating: false });
    await screen.findAllByTestId("server-row");
    expect(screen.queryByTestId("install-ref")).toBeNull();
    expect(screen.queryByTestId("uninstall")).toBeNull();
    expect(screen.getByTestId("servers-read-only-note")).toBeTruthy();
    cleanup();
    wrap(<ServersPage />, { user: bob, real_user: alice, impersonating: true }, "de");
    await screen.findAllByTestId("server-row");
    expect(screen.getByTestId("install-ref")).toHaveProperty("disabled", true);
    expect(screen.getByTestId("install-submit")).toHaveProperty("disabled", true);
    expect(screen.getByTestId("uninstall")).toHaveProperty("disabled", true);
    expect(screen.getByTestId("uninstall").getAttribute("title")).toContain("Deaktiviert");
  });

  it("empty", async () => {
    handler = () => respond(200, []);
    wrap(<ServersPage />, { user: bob, impersonating: false });
    await screen.findByTestId("empty-state");
  });
});

describe("users", () => {
  it("lists and starts view-as", async () => {
    handler = (url, method) => {
      if (url === "/api/users") return respond(200, [alice, bob]);
      if (url === "/api/admin/impersonate" && method === "POST") return respond(204);
      return respond(404, { error: { code: "not_found", message: "no" } });
    };
    wrap(<UsersPage />, { user: alice, impersonating: false });
    const rows = await screen.findAllByTestId("user-row");
    expect(rows).toHaveLength(2);
    expect(within(rows[0]!).queryByTestId("view-as")).toBeNull();
    expect(within(rows[0]!).getByTestId("user-role").dataset.tone).toBe("info");
    fireEvent.click(within(rows[1]!).getByTestId("view-as"));
    await waitFor(() => expect(push).toHaveBeenCalledWith("/"));
    expect(reload).toHaveBeenCalled();
    expect(calls.at(-1)?.body).toEqual({ user_id: 2, ttl_minutes: 60 });
  });
  it("not allowed for users", async () => {
    handler = () => respond(500);
    wrap(<UsersPage />, { user: bob, impersonating: false });
    expect(screen.getByTestId("empty-state").textContent).toContain("Not allowed");
    expect(calls).toHaveLength(0);
  });
});

function ev(id: number, kind: "egress" | "auth" | "admin") {
  return { id, ts: "2025-01-01T00:00:00Z", kind, user_id: 1, profile_id: 0, server: "", host: "", decision: "allow", detail: "" };
}

describe("audit", () => {
  it("paginates and filters", async () => {
    handler = (url) => {
      const u = new URL(url, "http://x");
      const before = u.searchParams.get("before");
      if (!before) return respond(200, { events: [ev(5, "egress"), ev(4, "auth"), ev(3, "admin")], next_before: 3 });
      return respond(200, { events: [ev(2, "egress"), ev(1, "admin")], next_before: 0 });
    };
    wrap(<AuditPage />, { user: alice, impersonating: false });
    await screen.findAllByTestId("audit-row");
    expect(screen.getByTestId("audit-count").textContent).toBe("Showing 3 of 3 loaded events");
    fireEvent.click(screen.getByTestId("load-more"));
    await waitFor(() => expect(screen.getAllByTestId("audit-row")).toHaveLength(5));
    expect(calls.at(-1)?.url).toBe("/api/audit?before=3&limit=50");
    expect(screen.getByTestId("end-of-log")).toBeTruthy();
    expect(screen.queryByTestId("load-more")).toBeNull();
    const chip = screen.getAllByTestId("kind-chip").find((c) => c.dataset.kind === "egress")!;
    fireEvent.click(chip);
    expect(chip.getAttribute("aria-pressed")).toBe("true");
    expect(screen.getAllByTestId("audit-row")).toHaveLength(2);
    expect(screen.getByTestId("audit-count").textContent).toBe("Showing 2 of 5 loaded events");
    // user filter
    fireEvent.change(screen.getByTestId("user-filter-id"), { target: { value: "7" } });
    fireEvent.click(screen.getByTestId("user-filter-apply"));
    await waitFor(() => expect(calls.at(-1)?.url).toBe("/api/audit?limit=50&user_id=7"));
    await screen.findAllByTestId("audit-row");
    expect(screen.getByTestId("audit-count").textContent).toBe("Showing 1 of 3 loaded events");
  });
  it("error + retry, empty", async () => {
    let fail = true;
    handler = () => (fail ? respond(500, { error: { code: "internal", message: "boom" } }) : respond(200, { events: [], next_before: 0 }));
    wrap(<AuditPage />, { user: bob, impersonating: false }, "de");
    await screen.findByTestId("error-state");
    expect(screen.queryByTestId("user-filter")).toBeNull();
    fail = false;
    await act(async () => fireEvent.click(screen.getByRole("button", { name: "Erneut versuchen" })));
    await screen.findByTestId("empty-state");
  });
});
