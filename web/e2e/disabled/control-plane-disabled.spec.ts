/**
 * Phase `disabled`: the gateway runs without OIDC, so the control plane answers
 * `control_plane_disabled`. The login page says which variables to set; signed-in pages
 * send the browser there. Screenshots: control-plane-disabled-<theme>[-phone].png.
 */
import { expect, test } from "@playwright/test";

import { DESKTOP, E2E, PHONE, THEMES, setTheme, snap } from "../support";

test("the login page shows the control_plane_disabled explanation instead of a sign-in button", async ({
  page,
}) => {
  const me = page.waitForResponse((response) => response.url().endsWith("/api/me"));
  await page.goto("/login");
  const answer = await me;
  expect((await answer.json()).error.code).toBe("control_plane_disabled");
  const block = page.getByTestId("control-plane-disabled");
  await expect(block).toBeVisible();
  for (const name of ["SVC_OIDC_ISSUER", "SVC_OIDC_CLIENT_ID", "SVC_OIDC_REDIRECT_URL"]) {
    await expect(block).toContainText(name);
  }
  await expect(page.getByTestId("sign-in")).toHaveCount(0);
});

test("signed-in pages go to the login page, which explains", async ({ page }) => {
  for (const path of ["/", "/profiles", "/audit"]) {
    await page.goto(path);
    await page.waitForURL(`${E2E.baseURL}/login`);
    await expect(page.getByTestId("control-plane-disabled")).toBeVisible();
  }
});

test("the explanation is translated", async ({ page }) => {
  await page.goto("/login");
  const block = page.getByTestId("control-plane-disabled");
  const english = (await block.locator("h1").textContent()) ?? "";
  await page.getByTestId("language-switcher").selectOption("de");
  await expect(page.locator("html")).toHaveAttribute("lang", "de");
  await expect(block.locator("h1")).not.toHaveText(english);
  await expect(block).toContainText("SVC_OIDC_ISSUER");
});

test("screenshots: light and dark, desktop and phone", async ({ page }) => {
  for (const theme of THEMES) {
    await page.setViewportSize(DESKTOP);
    await page.goto("/login");
    await expect(page.getByTestId("control-plane-disabled")).toBeVisible();
    await setTheme(page, theme);
    await snap(page, `control-plane-disabled-${theme}`);
    await page.setViewportSize(PHONE);
    await page.reload();
    await expect(page.getByTestId("control-plane-disabled")).toBeVisible();
    await snap(page, `control-plane-disabled-${theme}-phone`);
  }
});
