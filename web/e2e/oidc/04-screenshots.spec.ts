/**
 * Screenshots of every page in both themes, at desktop width and at 375 px (a phone):
 * <E2E_SCREENSHOTS>/<page>-<theme>.png and <page>-<theme>-phone.png (by default
 * web/e2e-artifacts/screenshots, gitignored). The control-plane-disabled page is taken by
 * the `disabled` phase (e2e/disabled).
 *
 * At phone width, a page wider than the screen (horizontal scrolling) fails the test.
 */
import { expect, test, type Locator, type Page } from "@playwright/test";

import { DESKTOP, E2E, PHONE, THEMES, setTheme, signIn, snap } from "../support";

interface Shot {
  name: string;
  path: string;
  ready: (page: Page) => Locator;
}

async function settled(page: Page, ready: Locator): Promise<void> {
  await expect(ready.first()).toBeVisible();
  await expect(page.getByTestId("loading")).toHaveCount(0);
  await expect(page.locator(".animate-pulse")).toHaveCount(0);
}

async function noHorizontalScroll(page: Page, name: string): Promise<void> {
  const { scroll, client } = await page.evaluate(() => ({
    scroll: document.documentElement.scrollWidth,
    client: document.documentElement.clientWidth,
  }));
  expect(scroll, `${name} scrolls sideways at ${PHONE.width} px`).toBeLessThanOrEqual(client);
}

test("every signed-in page, light and dark, desktop and phone", async ({ page }) => {
  test.setTimeout(240_000);
  await signIn(page, E2E.admin);
  await page.goto("/profiles");
  await expect(page.getByTestId("profile-row").first()).toBeVisible();
  const detail = (await page.getByTestId("profile-row").first().getByRole("link").first().getAttribute("href")) ?? "";
  expect(detail).toMatch(/^\/profiles\/\d+$/);

  const shots: Shot[] = [
    { name: "overview", path: "/", ready: (p) => p.getByTestId("count-profiles") },
    { name: "servers", path: "/servers", ready: (p) => p.getByTestId("server-row") },
    { name: "profiles", path: "/profiles", ready: (p) => p.getByTestId("profile-row") },
    { name: "profile-detail", path: detail, ready: (p) => p.getByTestId("endpoint-url") },
    { name: "credentials", path: "/credentials", ready: (p) => p.getByTestId("cred-server") },
    { name: "users", path: "/users", ready: (p) => p.getByTestId("user-row") },
    { name: "audit", path: "/audit", ready: (p) => p.getByTestId("audit-row") },
  ];

  for (const theme of THEMES) {
    await page.setViewportSize(DESKTOP);
    await page.goto("/");
    await setTheme(page, theme);
    for (const viewport of [DESKTOP, PHONE]) {
      await page.setViewportSize(viewport);
      const suffix = viewport === PHONE ? "-phone" : "";
      for (const shot of shots) {
        await test.step(`${shot.name} ${theme}${suffix}`, async () => {
          await page.goto(shot.path);
          await settled(page, shot.ready(page));
          const dark = expect(page.locator("html"));
          if (theme === "dark") await dark.toHaveClass(/(^|\s)dark(\s|$)/);
          else await dark.not.toHaveClass(/(^|\s)dark(\s|$)/);
          await snap(page, `${shot.name}-${theme}${suffix}`);
          if (viewport === PHONE) await noHorizontalScroll(page, shot.name);
        });
      }
    }
  }
});

test("the login page, light and dark, desktop and phone", async ({ page }) => {
  for (const theme of THEMES) {
    await page.setViewportSize(DESKTOP);
    await page.goto("/login");
    await expect(page.getByTestId("sign-in")).toBeVisible();
    await setTheme(page, theme);
    await snap(page, `login-${theme}`);
    await page.setViewportSize(PHONE);
    await page.reload();
    await expect(page.getByTestId("sign-in")).toBeVisible();
    await snap(page, `login-${theme}-phone`);
    await noHorizontalScroll(page, "login");
  }
});
