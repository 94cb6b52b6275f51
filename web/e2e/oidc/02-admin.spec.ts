/**
 * The admin (E2E_ADMIN, alice): every page including Users, installing a server by registry
 * ref and uninstalling it, viewing as a plain user (banner, every mutation disabled, stop),
 * and paging through the audit log.
 */
import { expect, test, type Page } from "@playwright/test";

import { E2E, confirm, signIn, signOut } from "../support";

const run = Date.now().toString(36);

async function userRow(page: Page, email: string) {
  await page.goto("/users");
  const row = page.getByTestId("user-row").filter({ hasText: email });
  await expect(row).toBeVisible();
  return row;
}

test("the admin sees the users count and the Users page", async ({ page }) => {
  await signIn(page, E2E.admin);
  await expect(page.getByTestId("count-users")).toBeVisible();
  const nav = page.getByRole("navigation");
  await nav.getByRole("link", { name: "Users" }).click();
  await page.waitForURL(`${E2E.baseURL}/users`);
  const bob = page.getByTestId("user-row").filter({ hasText: E2E.userEmail });
  await expect(bob).toBeVisible();
  await expect(bob.getByTestId("user-role")).toHaveAttribute("data-role", "user");
  const self = page.getByTestId("user-row").filter({ has: page.getByTestId("user-self") });
  await expect(self.getByTestId("user-role")).toHaveAttribute("data-role", "admin");
});

test("the admin installs a server by registry ref and uninstalls it", async ({ page }) => {
  test.skip(E2E.installRef === "", "no registry ref to install (E2E_INSTALL_REF)");
  const name = E2E.installRef.split("@")[0] ?? "";
  await signIn(page, E2E.admin);
  await page.goto("/servers");
  const row = page.locator(`[data-testid="server-row"][data-server="${name}"]`);
  await expect(page.getByTestId("server-row").first()).toBeVisible();
  await expect(row).toHaveCount(0);

  // A malformed ref is refused by the form without a request.
  await page.getByTestId("install-ref").fill("not a ref!");
  await page.getByTestId("install-submit").click();
  await expect(page.getByTestId("install-ref")).toHaveAttribute("aria-invalid", "true");

  await page.getByTestId("install-ref").fill(E2E.installRef);
  const installed = page.waitForResponse(
    (response) => response.url().endsWith("/api/servers/install") && response.request().method() === "POST",
    { timeout: 120_000 },
  );
  await page.getByTestId("install-submit").click();
  const response = await installed;
  expect(response.status(), await response.text()).toBe(201);
  await expect(page.getByTestId("install-result")).toContainText(name);
  await expect(row).toBeVisible();

  await row.getByTestId("uninstall").click();
  const removed = page.waitForResponse(
    (r) => r.url().endsWith(`/api/servers/${name}`) && r.request().method() === "DELETE",
    { timeout: 60_000 },
  );
  await confirm(page);
  expect((await removed).status()).toBe(204);
  await expect(page.getByTestId("uninstall-done")).toContainText(name);
  await expect(row).toHaveCount(0);
});

test("view as a plain user: banner shown, every mutation disabled, stop", async ({ page }) => {
  await signIn(page, E2E.admin);
  const row = await userRow(page, E2E.userEmail);
  const started = page.waitForResponse(
    (response) => response.url().endsWith("/api/admin/impersonate") && response.request().method() === "POST",
  );
  await row.getByTestId("view-as").click();
  if (await page.getByRole("alertdialog").isVisible()) await confirm(page);
  expect((await started).status()).toBeLessThan(300);

  const banner = page.getByTestId("view-as-banner");
  await expect(banner).toBeVisible();
  await expect(banner).toContainText(E2E.userName);
  await expect(page.getByRole("button", { name: "Sign out" })).toBeDisabled();

  await test.step("profiles: the viewed user's list, creation disabled", async () => {
    await page.goto("/profiles");
    await expect(banner).toBeVisible();
    await expect(page.getByTestId("create-profile")).toBeDisabled();
    const first = page.getByTestId("profile-row").first();
    await expect(first).toBeVisible();
    await first.getByRole("link").first().click();
    await page.waitForURL(/\/profiles\/\d+$/);
  });

  await test.step("profile detail: bundle, token, rename and delete disabled", async () => {
    await expect(page.getByTestId("endpoint-url")).toBeVisible();
    await expect(page.getByTestId("save-bundle")).toBeDisabled();
    for (const checkbox of await page.getByTestId("bundle-server").all()) await expect(checkbox).toBeDisabled();
    await expect(page.getByTestId("rotate-token")).toBeDisabled();
    await expect(page.getByTestId("rename")).toBeDisabled();
    await expect(page.getByTestId("delete-profile")).toBeDisabled();
  });

  await test.step("credentials: saving and deleting disabled", async () => {
    await page.goto("/credentials");
    await expect(banner).toBeVisible();
    await expect(page.getByTestId("save-credential")).toBeDisabled();
    for (const button of await page.getByTestId("delete-credential").all()) await expect(button).toBeDisabled();
  });

  await test.step("servers: install and uninstall disabled", async () => {
    await page.goto("/servers");
    await expect(page.getByTestId("server-row").first()).toBeVisible();
    await expect(page.getByTestId("install-submit")).toBeDisabled();
    for (const button of await page.getByTestId("uninstall").all()) await expect(button).toBeDisabled();
  });

  await test.step("users: no view-as while viewing", async () => {
    await page.goto("/users");
    await expect(page.getByTestId("user-row").first()).toBeVisible();
    for (const button of await page.getByTestId("view-as").all()) await expect(button).toBeDisabled();
  });

  await test.step("the gateway refuses writes while viewing, whatever the page does", async () => {
    const refused = await page.request.post("/api/profiles", {
      data: { name: "nope", slug: `nope-${run}` },
    });
    expect(refused.status()).toBe(403);
    expect((await refused.json()).error.code).toBe("impersonating");
  });

  await test.step("stop viewing: the banner goes, controls come back", async () => {
    const stopped = page.waitForResponse(
      (response) => response.url().endsWith("/api/admin/impersonate") && response.request().method() === "DELETE",
    );
    await banner.getByRole("button", { name: "Stop viewing" }).click();
    expect((await stopped).status()).toBeLessThan(300);
    await expect(banner).toBeHidden();
    await expect(page.getByRole("button", { name: "Sign out" })).toBeEnabled();
    await page.goto("/profiles");
    await expect(page.getByTestId("create-profile")).toBeEnabled();
    await expect(banner).toHaveCount(0);
  });
});

test("page through the audit log; kind chips filter the loaded events without a request", async ({ page }) => {
  test.setTimeout(180_000);
  await signIn(page, E2E.admin);
  // Enough events for three pages of 50 (each credential write and delete is audited, as
  // kind admin), with a sign-out and sign-in (kind auth) in the middle of them.
  await seedAuditEvents(page, 40);
  await signOut(page);
  await signIn(page, E2E.admin);
  await seedAuditEvents(page, 40);

  await page.goto("/audit");
  const rows = page.getByTestId("audit-row");
  await expect(rows).toHaveCount(50);
  const firstPage = await eventIds(page);

  for (const expected of [100, 150]) {
    const next = page.waitForResponse((response) => /\/api\/audit\?.*before=/.test(response.url()));
    await page.getByTestId("load-more").click();
    expect((await next).status()).toBe(200);
    await expect(rows).toHaveCount(expected);
  }
  const ids = await eventIds(page);
  expect(ids.slice(0, 50)).toEqual(firstPage);
  // Newest first, no duplicates, no gaps between pages.
  for (let i = 1; i < ids.length; i += 1) expect(ids[i]).toBeLessThan(ids[i - 1] as number);
  expect(new Set(ids).size).toBe(ids.length);

  // Chips filter what is loaded, client-side only.
  const loadedKinds = await rowKinds(page);
  const count = (kind: string) => loadedKinds.filter((k) => k === kind).length;
  expect(count("auth")).toBeGreaterThanOrEqual(2);
  expect(count("admin")).toBeGreaterThanOrEqual(80);
  let requested = 0;
  page.on("request", (request) => {
    if (request.url().includes("/api/audit")) requested += 1;
  });
  const chip = (kind: string) => page.locator(`[data-testid="kind-chip"][data-kind="${kind}"]`);
  await expect(chip("auth")).toHaveAttribute("aria-pressed", "false");
  await chip("auth").click();
  await expect(chip("auth")).toHaveAttribute("aria-pressed", "true");
  await expect(rows).toHaveCount(count("auth"));
  expect(new Set(await rowKinds(page))).toEqual(new Set(["auth"]));
  await chip("admin").click();
  await expect(rows).toHaveCount(count("auth") + count("admin"));
  expect(new Set(await rowKinds(page))).toEqual(new Set(["auth", "admin"]));
  await chip("auth").click();
  await chip("admin").click();
  await expect(chip("admin")).toHaveAttribute("aria-pressed", "false");
  await expect(rows).toHaveCount(150);
  expect(requested).toBe(0);
});

async function seedAuditEvents(page: Page, pairs: number): Promise<void> {
  for (let i = 0; i < pairs; i += 1) {
    const server = `seed-${run}-${i}`;
    const put = await page.request.put(`/api/credentials/${server}`, { data: { secret: `seed-secret-${run}` } });
    expect(put.status(), await put.text()).toBeLessThan(300);
    const del = await page.request.delete(`/api/credentials/${server}`);
    expect(del.status(), await del.text()).toBe(204);
  }
}

async function rowKinds(page: Page): Promise<string[]> {
  return page
    .getByTestId("audit-row")
    .evaluateAll((elements) => elements.map((element) => element.getAttribute("data-kind") ?? ""));
}

async function eventIds(page: Page): Promise<number[]> {
  return page
    .getByTestId("audit-row")
    .evaluateAll((elements) => elements.map((element) => Number(element.getAttribute("data-event-id"))));
}
