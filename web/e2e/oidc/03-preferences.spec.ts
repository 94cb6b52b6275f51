/**
 * Theme (light / dark / system, stored in the browser) and language (a cookie, no locale
 * routing: the URL never changes).
 */
import { expect, test, type Page } from "@playwright/test";

import { E2E, setTheme, signIn } from "../support";

test("switch the theme: applied at once, kept across a reload, system follows the OS", async ({ page }) => {
  await signIn(page, E2E.admin);
  const html = page.locator("html");
  await setTheme(page, "dark");
  expect(await page.evaluate(() => localStorage.getItem("svc_theme"))).toBe("dark");
  await page.reload();
  await expect(page.getByTestId("count-profiles")).toBeVisible();
  await expect(html).toHaveClass(/(^|\s)dark(\s|$)/);
  await expect(page.locator('input[name="theme"][value="dark"]')).toBeChecked();
  // The dark palette really applies: the page background is dark.
  expect(await backgroundLuminance(page)).toBeLessThan(0.1);

  await setTheme(page, "light");
  expect(await backgroundLuminance(page)).toBeGreaterThan(0.8);

  await page.emulateMedia({ colorScheme: "dark" });
  await setTheme(page, "system");
  await expect(html).toHaveClass(/(^|\s)dark(\s|$)/);
  await page.emulateMedia({ colorScheme: "light" });
  await expect(html).not.toHaveClass(/(^|\s)dark(\s|$)/);
  await setTheme(page, "light");
});

test("switch the language: a cookie, no locale in the URL, kept across a reload", async ({ page, context }) => {
  await signIn(page, E2E.admin);
  const nav = page.getByRole("navigation");
  await expect(nav.getByRole("link", { name: "Overview" })).toBeVisible();
  await expect(page.locator("html")).toHaveAttribute("lang", "en");

  await page.getByTestId("language-switcher").first().selectOption("de");
  await expect(nav.getByRole("link", { name: "Übersicht" })).toBeVisible();
  await expect(page.getByRole("button", { name: "Abmelden" })).toBeVisible();
  await expect(page.locator("html")).toHaveAttribute("lang", "de");
  expect(page.url()).toBe(`${E2E.baseURL}/`);
  const cookie = (await context.cookies()).find((c) => c.name === "svc_locale");
  expect(cookie?.value).toBe("de");

  await page.goto("/audit");
  await expect(page.getByRole("heading", { name: "Audit-Log" })).toBeVisible();
  await page.reload();
  await expect(nav.getByRole("link", { name: "Profile", exact: true })).toBeVisible();

  await page.getByTestId("language-switcher").first().selectOption("en");
  await expect(nav.getByRole("link", { name: "Profiles" })).toBeVisible();
  await expect(page.locator("html")).toHaveAttribute("lang", "en");
  expect(page.url()).toBe(`${E2E.baseURL}/audit`);
});

test("the language switcher works on the login page too", async ({ page }) => {
  await page.goto("/login");
  await expect(page.getByTestId("sign-in")).toBeVisible();
  const english = (await page.getByTestId("sign-in").textContent()) ?? "";
  await page.getByTestId("language-switcher").selectOption("de");
  await expect(page.locator("html")).toHaveAttribute("lang", "de");
  await expect(page.getByTestId("sign-in")).not.toHaveText(english);
  await page.getByTestId("language-switcher").selectOption("en");
  await expect(page.getByTestId("sign-in")).toHaveText(english);
});

/** Relative luminance (0..1) of the body's background, whatever CSS color syntax it uses. */
function backgroundLuminance(page: Page): Promise<number> {
  return page.evaluate(() => {
    const canvas = document.createElement("canvas");
    canvas.width = canvas.height = 1;
    const context = canvas.getContext("2d");
    if (context === null) throw new Error("no 2d canvas");
    context.fillStyle = getComputedStyle(document.body).backgroundColor;
    context.fillRect(0, 0, 1, 1);
    const [r = 0, g = 0, b = 0] = Array.from(context.getImageData(0, 0, 1, 1).data.slice(0, 3), (v) => {
      const c = v / 255;
      return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  });
}
