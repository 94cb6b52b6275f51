// @vitest-environment jsdom
import { cleanup, fireEvent, render, screen, waitFor } from "@testing-library/react";
import { NextIntlClientProvider } from "next-intl";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

import { useSession } from "@/components/session";
import { AppShell } from "@/components/shell/app-shell";
import { MESSAGES } from "@/i18n/messages";

const replace = vi.fn();
vi.mock("next/navigation", () => ({
  usePathname: () => "/",
  useRouter: () => ({ replace, push: vi.fn(), refresh: vi.fn() }),
}));

const alice = { id: 1, email: "alice@example.test", display_name: "Alice Admin", role: "admin" };
const bob = { id: 2, email: "bob@example.test", display_name: "Bob User", role: "user" };

function respond(status: number, body?: unknown): Response {
  return body === undefined
    ? new Response(null, { status })
    : new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

let meBody: unknown;
let meStatus = 200;
const calls: Array<{ url: string; method: string }> = [];

beforeEach(() => {
  calls.length = 0;
  replace.mockReset();
  vi.stubGlobal("fetch", async (url: string, init?: RequestInit) => {
    const method = init?.method ?? "GET";
    calls.push({ url, method });
    if (url === "/api/me") return respond(meStatus, meBody);
    if (url === "/api/admin/impersonate" && method === "DELETE") {
      meBody = { user: alice, impersonating: false };
      return respond(204);
    }
    return respond(404, { error: { code: "not_found", message: "no" } });
  });
});

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

function Probe() {
  const { readOnly, isAdmin } = useSession();
  return <button disabled={readOnly} data-admin={String(isAdmin)}>mutate</button>;
}

function renderShell() {
  return render(
    <NextIntlClientProvider locale="en" messages={MESSAGES.en}>
      <AppShell>
        <Probe />
      </AppShell>
    </NextIntlClientProvider>,
  );
}

describe("AppShell", () => {
  it("shows the view-as banner, disables mutations, and stops", async () => {
    meBody = { user: bob, impersonating: true, real_user: alice };
    meStatus = 200;
    renderShell();
    const banner = await screen.findByTestId("view-as-banner");
    expect(banner.textContent).toContain("Bob User");
    expect(banner.textContent).toContain("bob@example.test");
    const probe = screen.getByRole("button", { name: "mutate" });
    expect(probe).toHaveProperty("disabled", true);
    // Admin rights follow the real user; sign-out is a mutation and is disabled too.
    expect(probe.getAttribute("data-admin")).toBe("true");
    expect(screen.getByRole("button", { name: "Sign out" })).toHaveProperty("disabled", true);
    expect(screen.getByRole("link", { name: "Users" })).toBeTruthy();

    fireEvent.click(screen.getByRole("button", { name: "Stop viewing" }));
    await waitFor(() => expect(screen.queryByTestId("view-as-banner")).toBeNull());
    expect(calls).toContainEqual({ url: "/api/admin/impersonate", method: "DELETE" });
    expect(screen.getByRole("button", { name: "mutate" })).toHaveProperty("disabled", false);
  });

  it("hides the Users page from plain users", async () => {
    meBody = { user: bob, impersonating: false };
    meStatus = 200;
    renderShell();
    await screen.findByRole("button", { name: "mutate" });
    expect(screen.queryByRole("link", { name: "Users" })).toBeNull();
    expect(screen.queryByTestId("view-as-banner")).toBeNull();
  });

  it("sends a signed-out visitor to /login", async () => {
    meBody = { error: { code: "unauthenticated", message: "sign in" } };
    meStatus = 401;
    renderShell();
    await waitFor(() => expect(replace).toHaveBeenCalledWith("/login"));
  });

  it("offers a retry when the gateway is down", async () => {
    vi.stubGlobal("fetch", async () => new Response("<html>502</html>", { status: 502, headers: { "Content-Type": "text/html" } }));
    renderShell();
    const alert = await screen.findByTestId("error-state");
    expect(alert.textContent).toContain("not reachable");
    expect(screen.getByRole("button", { name: "Retry" })).toBeTruthy();
    expect(replace).not.toHaveBeenCalled();
  });
});
