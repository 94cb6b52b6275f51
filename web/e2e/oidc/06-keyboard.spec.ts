/**
 * Keyboard only: a profile is created, its token dialog read and closed, and a destructive
 * confirmation cancelled with Escape and then accepted, without touching the mouse. Dialogs
 * trap focus and give it back to the control that opened them.
 */
import { expect, test } from "@playwright/test";

import { E2E, signIn } from "../support";

const run = Date.now().toString(36);

test("create a profile and delete it with the keyboard alone; dialogs trap and return focus", async ({ page }) => {
  const slug = `e2e-keys-${run}`;
  await signIn(page, E2E.user);
  await page.goto("/profiles");
  await expect(page.getByTestId("loading")).toHaveCount(0);

  // Fill the form and submit with Enter.
  await page.getByTestId("profile-name").focus();
  await page.keyboard.type(`Keys ${run}`);
  await page.keyboard.press("Tab");
  await expect(page.getByTestId("profile-slug")).toBeFocused();
  await page.keyboard.press("ControlOrMeta+a");
  await page.keyboard.type(slug);
  await page.keyboard.press("Enter");

  // The token dialog has focus inside it; Tab never leaves it; Escape closes it.
  const dialog = page.getByRole("dialog");
  await expect(dialog).toBeVisible();
  await expect(dialog.getByTestId("token-value")).toContainText("svc_");
  for (let i = 0; i < 6; i += 1) {
    await page.keyboard.press("Tab");
    expect(await dialog.evaluate((node) => node.contains(document.activeElement))).toBe(true);
  }
  await page.keyboard.press("Escape");
  await expect(dialog).toHaveCount(0);
  await expect(page.getByTestId("token-value")).toHaveCount(0);

  // Open the profile from the list with Enter on its link.
  const row = page.locator(`[data-testid="profile-row"][data-slug="${slug}"]`);
  await row.getByRole("link").first().focus();
  await page.keyboard.press("Enter");
  await page.waitForURL(/\/profiles\/\d+$/);

  // Delete: Escape cancels and focus returns to the button; Enter on confirm deletes.
  const remove = page.getByTestId("delete-profile");
  await remove.focus();
  await page.keyboard.press("Enter");
  const confirmDialog = page.getByRole("alertdialog");
  await expect(confirmDialog).toBeVisible();
  // Radix AlertDialog starts on Cancel, the safe choice.
  await expect(confirmDialog.getByRole("button", { name: "Cancel" })).toBeFocused();
  await page.keyboard.press("Escape");
  await expect(confirmDialog).toHaveCount(0);
  await expect(remove).toBeFocused();

  await page.keyboard.press("Enter");
  await expect(confirmDialog).toBeVisible();
  await confirmDialog.getByTestId("confirm").focus();
  await page.keyboard.press("Enter");
  await page.waitForURL(`${E2E.baseURL}/profiles`);
  await expect(page.getByTestId("loading")).toHaveCount(0);
  await expect(row).toHaveCount(0);
});
