/**
 * A plain user (E2E_USER, bob) against the real gateway and the real identity provider:
 * sign in, create a profile, edit its bundle, rotate its token and use the new token against
 * /mcp/p/<slug> through the dashboard's port; enter and delete a credential whose secret
 * never reaches the browser.
 */
import { expect, test } from "@playwright/test";

import {
  E2E,
  confirm,
  fillOrSelect,
  initialize,
  McpSession,
  readValue,
  recordResponses,
  signIn,
  signOut,
  takeToken,
  toolText,
} from "../support";

const run = Date.now().toString(36);

test("a plain user signs in through the identity provider, sees no admin controls, signs out", async ({ page }) => {
  await signIn(page, E2E.user);
  await expect(page.getByTestId("signed-in-user")).toContainText(E2E.userName);
  // No users count, no Users page in the navigation.
  await expect(page.getByTestId("count-users")).toHaveCount(0);
  const nav = page.getByRole("navigation");
  await expect(nav.getByRole("link", { name: "Profiles" })).toBeVisible();
  await expect(nav.getByRole("link", { name: "Users" })).toHaveCount(0);
  // The servers page is a read-only list for non-admins.
  await nav.getByRole("link", { name: "Servers" }).click();
  await expect(page.getByTestId("server-row").first()).toBeVisible();
  for (const name of E2E.servers) {
    await expect(page.locator(`[data-testid="server-row"][data-server="${name}"]`)).toBeVisible();
  }
  await expect(page.getByTestId("install-ref")).toHaveCount(0);
  await expect(page.getByTestId("uninstall")).toHaveCount(0);
  await signOut(page);
  // Signed out for real: the dashboard sends us back to the login page.
  await page.goto("/profiles");
  await page.waitForURL(`${E2E.baseURL}/login`);
  await expect(page.getByTestId("sign-in")).toBeVisible();
});

test("create a profile, edit its bundle, rotate its token; the new token works through port 3000", async ({
  page,
  request,
}) => {
  const slug = `e2e-${run}`;
  const name = `E2E profile ${run}`;
  await signIn(page, E2E.user);

  let firstToken = "";
  let profileId = "";
  await test.step("create the profile: its token is shown once", async () => {
    await page.goto("/profiles");
    await page.getByTestId("profile-name").fill(name);
    await page.getByTestId("profile-slug").fill(slug);
    const created = page.waitForResponse(
      (response) => response.url().endsWith("/api/profiles") && response.request().method() === "POST",
    );
    await page.getByTestId("create-profile").click();
    expect((await created).status()).toBe(201);
    firstToken = await takeToken(page);
    const row = page.locator(`[data-testid="profile-row"][data-slug="${slug}"]`);
    await expect(row).toBeVisible();
    await expect(row).toContainText(name);
    await expect(row).toContainText(`/mcp/p/${slug}`);
    // The plaintext token is gone once the dialog is closed.
    expect(await page.content()).not.toContain(firstToken);
    await row.getByRole("link", { name }).click();
    await page.waitForURL(/\/profiles\/\d+$/);
    profileId = new URL(page.url()).pathname.split("/").pop() ?? "";
  });

  await test.step("the detail page shows the endpoint and a client config", async () => {
    await expect(page.getByTestId("endpoint-url")).toContainText(`/mcp/p/${slug}`);
    await expect(page.getByTestId("client-config")).toContainText(`/mcp/p/${slug}`);
    await expect(page.getByTestId("runtime-status")).toBeVisible();
  });

  await test.step("edit the bundle: a replace-all PUT of the checked servers", async () => {
    for (const server of E2E.bundle) {
      await page.locator(`[data-testid="bundle-server"][data-server="${server}"]`).check();
    }
    const saved = page.waitForResponse(
      (response) => response.url().endsWith(`/api/profiles/${profileId}/servers`) && response.request().method() === "PUT",
    );
    await page.getByTestId("save-bundle").click();
    const response = await saved;
    expect(response.status()).toBe(200);
    expect(response.request().postDataJSON()).toEqual({ servers: expect.arrayContaining(E2E.bundle) });
    expect((response.request().postDataJSON() as { servers: string[] }).servers).toHaveLength(E2E.bundle.length);
    await page.reload();
    for (const server of E2E.bundle) {
      await expect(page.locator(`[data-testid="bundle-server"][data-server="${server}"]`)).toBeChecked();
    }
  });

  const endpoint = `${E2E.baseURL}/mcp/p/${slug}`;
  await test.step("the first token works through the dashboard's /mcp rewrite", async () => {
    const session = await McpSession.open(request, endpoint, firstToken);
    const tools = await session.call("tools/list");
    const names = ((tools.result?.tools ?? []) as Array<{ name: string }>).map((tool) => tool.name);
    for (const server of E2E.bundle) expect(names).toContain(`${server}_echo`);
    await session.close();
  });

  let newToken = "";
  await test.step("rotate the token: confirm, then the new plaintext is shown once", async () => {
    await page.getByTestId("rotate-token").click();
    const rotated = page.waitForResponse(
      (response) => response.url().endsWith(`/api/profiles/${profileId}/token`) && response.request().method() === "POST",
    );
    await confirm(page);
    expect((await rotated).status()).toBe(200);
    newToken = await takeToken(page);
    expect(newToken).not.toBe(firstToken);
    expect(await page.content()).not.toContain(newToken);
  });

  await test.step("the new token calls a tool through port 3000; the old one gets 401", async () => {
    const session = await McpSession.open(request, endpoint, newToken);
    const [server] = E2E.bundle;
    const text = `hello through the rewrite ${run}`;
    const result = await session.call("tools/call", { name: `${server}_echo`, arguments: { text } });
    expect(result.error).toBeUndefined();
    expect(toolText(result)).toBe(text);
    await session.close();
    const refused = await initialize(request, endpoint, firstToken);
    expect(refused.status()).toBe(401);
    expect(refused.headers()["www-authenticate"]).toMatch(/^Bearer/);
  });

  await test.step("the runtime is warm after the call", async () => {
    await page.reload();
    await expect(page.getByTestId("runtime-status")).toHaveAttribute("data-state", "warm");
    for (const server of E2E.bundle) {
      await expect(page.locator(`[data-testid="runtime-server"][data-server="${server}"]`)).toHaveAttribute(
        "data-state",
        "ready",
      );
    }
  });

  await test.step("rename the profile", async () => {
    const renamed = `${name} renamed`;
    await page.getByTestId("rename-input").fill(renamed);
    const patched = page.waitForResponse(
      (response) => response.url().endsWith(`/api/profiles/${profileId}`) && response.request().method() === "PATCH",
    );
    await page.getByTestId("rename").click();
    expect((await patched).status()).toBe(200);
    await page.goto("/profiles");
    await expect(page.locator(`[data-testid="profile-row"][data-slug="${slug}"]`)).toContainText(renamed);
  });
});

test("delete a profile after confirming", async ({ page }) => {
  const slug = `e2e-gone-${run}`;
  await signIn(page, E2E.user);
  await page.goto("/profiles");
  await page.getByTestId("profile-name").fill(`Doomed ${run}`);
  await page.getByTestId("profile-slug").fill(slug);
  await page.getByTestId("create-profile").click();
  await takeToken(page);
  const row = page.locator(`[data-testid="profile-row"][data-slug="${slug}"]`);
  await row.getByRole("link").click();
  await page.waitForURL(/\/profiles\/\d+$/);
  await page.getByTestId("delete-profile").click();
  await confirm(page);
  await page.waitForURL(`${E2E.baseURL}/profiles`);
  await expect(page.getByTestId("profile-name")).toBeVisible();
  await expect(page.getByTestId("loading")).toHaveCount(0);
  await expect(row).toHaveCount(0);
  await page.reload();
  await expect(page.getByTestId("loading")).toHaveCount(0);
  await expect(row).toHaveCount(0);
});

test("enter and delete a credential: the secret never appears in the page or any response", async ({ page }) => {
  const secret = `e2e-secret-${run}-${Math.random().toString(36).slice(2)}`;
  const server = E2E.credentialServer;
  const responses = recordResponses(page);
  await signIn(page, E2E.user);
  await page.goto("/credentials");

  await fillOrSelect(page.getByTestId("cred-server"), server);
  await page.getByTestId("cred-secret").fill(secret);
  await page.getByTestId("cred-header").fill("Authorization");
  await page.getByTestId("cred-format").fill("Bearer {token}");
  await page.getByTestId("cred-placeholder").fill(`PLACEHOLDER_${run}`);
  await page.getByTestId("cred-hosts").fill("api.example.test");
  const saved = page.waitForResponse(
    (response) => response.url().endsWith(`/api/credentials/${server}`) && response.request().method() === "PUT",
  );
  await page.getByTestId("save-credential").click();
  const put = await saved;
  expect(put.status()).toBeLessThan(300);
  // The write carried the secret (so the check below is not vacuous)...
  expect(put.request().postData() ?? "").toContain(secret);

  const row = page.locator(`[data-testid="credential-row"][data-server="${server}"]`);
  await expect(row).toBeVisible();
  await expect(row).toContainText("Authorization");
  await expect(row).toContainText("api.example.test");
  // ...but the page never shows it, the form forgot it, and a reload does not bring it back.
  await expect(page.getByTestId("cred-secret")).toHaveValue("");
  expect(await page.content()).not.toContain(secret);
  expect(await page.locator("body").innerText()).not.toContain(secret);
  await page.reload();
  await expect(row).toBeVisible();
  expect(await page.content()).not.toContain(secret);

  await row.getByTestId("delete-credential").click();
  const deleted = page.waitForResponse(
    (response) => response.url().endsWith(`/api/credentials/${server}`) && response.request().method() === "DELETE",
  );
  await confirm(page);
  expect((await deleted).status()).toBe(204);
  await expect(row).toHaveCount(0);
  expect(await page.content()).not.toContain(secret);

  const seen = await responses.all();
  expect(seen.some((response) => response.url.includes("/api/credentials"))).toBe(true);
  const leaks = seen.filter((response) => response.body.includes(secret) || response.headers.includes(secret));
  expect(leaks.map((response) => `${response.status} ${response.url}`)).toEqual([]);
});

test("the credentials form refuses invalid input before sending it", async ({ page }) => {
  await signIn(page, E2E.user);
  await page.goto("/credentials");
  let sent = 0;
  page.on("request", (request) => {
    if (request.url().includes("/api/credentials/") && request.method() === "PUT") sent += 1;
  });
  await fillOrSelect(page.getByTestId("cred-server"), E2E.credentialServer);
  await page.getByTestId("cred-secret").fill("not-sent");
  await page.getByTestId("cred-header").fill("Bad Header:");
  await page.getByTestId("cred-hosts").fill("Not A Host!");
  const save = page.getByTestId("save-credential");
  if (await save.isEnabled()) await save.click();
  await expect(page.locator("[aria-invalid=true]").first()).toBeVisible();
  expect(sent).toBe(0);
  expect(await readValue(page.getByTestId("cred-header"))).toBe("Bad Header:");
});
