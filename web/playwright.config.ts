/**
 * End-to-end tests of the dashboard (`web/e2e`), driven by Debian's chromium at
 * /usr/bin/chromium. Playwright never downloads a browser here: the executable is given
 * explicitly, and `npm ci` runs with PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1.
 *
 * The specs need the real stack (gateway, local identity provider, `next start` on port
 * 3000): run them through the Python orchestrator, which builds the dashboard, starts
 * everything and passes the E2E_* variables (see tests/web/test_dashboard_e2e.py):
 *
 *     .venv/bin/python -m pytest tests/web -s
 *
 * Phases (E2E_PHASE): `oidc` runs e2e/oidc/*.spec.ts against a gateway with sign-in
 * configured; `disabled` runs e2e/disabled/*.spec.ts against a gateway without OIDC.
 *
 * Screenshots of every page in both themes (desktop, and at 375 px phone width) are written
 * by the run to web/e2e-artifacts/screenshots/<page>-<theme>.png and
 * <page>-<theme>-phone.png (override the directory with E2E_SCREENSHOTS). That directory
 * is gitignored: screenshots are produced, never committed. Traces and screenshots of
 * failures go to web/test-results/.
 */
import { existsSync } from "node:fs";

import { defineConfig, devices } from "@playwright/test";

const CHROMIUM = process.env.E2E_CHROMIUM ?? "/usr/bin/chromium";
const phase = process.env.E2E_PHASE ?? "oidc";
if (phase !== "oidc" && phase !== "disabled") {
  throw new Error(`E2E_PHASE must be "oidc" or "disabled", not ${JSON.stringify(phase)}`);
}
if (!existsSync(CHROMIUM)) {
  // Never fall back to a downloaded browser: install Debian's chromium (scripts/system-packages).
  throw new Error(`${CHROMIUM} is missing: install Debian's chromium package`);
}

export default defineConfig({
  testDir: "e2e",
  testMatch: `${phase}/**/*.spec.ts`,
  fullyParallel: false,
  workers: 1,
  retries: 0,
  forbidOnly: Boolean(process.env.CI),
  reporter: "list",
  outputDir: "test-results",
  timeout: 120_000,
  globalTimeout: 20 * 60_000,
  expect: { timeout: 15_000 },
  use: {
    baseURL: process.env.E2E_BASE_URL ?? "http://localhost:3000",
    trace: "retain-on-failure",
    screenshot: "only-on-failure",
    video: "off",
    locale: "en-US",
    timezoneId: "UTC",
    actionTimeout: 15_000,
    navigationTimeout: 30_000,
  },
  projects: [
    {
      name: "chromium",
      use: {
        ...devices["Desktop Chrome"],
        viewport: { width: 1280, height: 800 },
        launchOptions: {
          executablePath: CHROMIUM,
          args: [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            // Without these, this machine's closed network refuses many connections.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
          ],
        },
      },
    },
  ],
});
