/**
 * Shared helpers of the end-to-end specs: the environment the Python orchestrator passes
 * (tests/web/test_dashboard_e2e.py), sign-in through the real identity provider's HTML
 * form, theme switching, screenshots, response recording and a minimal MCP client over
 * Playwright's APIRequestContext.
 */
import { mkdirSync } from "node:fs";
import path from "node:path";

import { expect, type APIRequestContext, type APIResponse, type Locator, type Page } from "@playwright/test";

function list(value: string | undefined, fallback: string[]): string[] {
  if (value === undefined || value.trim() === "") return fallback;
  return value
    .split(",")
    .map((item) => item.trim())
    .filter((item) => item !== "");
}

/** What the orchestrator tells the specs (every variable has a default for local runs). */
export const E2E = {
  baseURL: (process.env.E2E_BASE_URL ?? "http://localhost:3000").replace(/\/$/, ""),
  /** The identity provider's issuer, e.g. http://127.0.0.1:PORT (the sign-in form lives there). */
  idpURL: (process.env.E2E_IDP_URL ?? "").replace(/\/$/, ""),
  admin: process.env.E2E_ADMIN ?? "alice",
  user: process.env.E2E_USER ?? "bob",
  /** Display name of E2E_USER at the identity provider (the view-as banner names them). */
  userName: process.env.E2E_USER_NAME ?? "Bob User",
  userEmail: process.env.E2E_USER_EMAIL ?? "bob@example.test",
  /** Servers to put in the profile's bundle; the first one must offer an `echo` tool. */
  bundle: list(process.env.E2E_BUNDLE, ["echo", "probe"]),
  /** Every server installed before the run (the servers page must list them). */
  servers: list(process.env.E2E_SERVERS, ["echo", "probe"]),
  /** A registry ref the admin installs from the servers page (`name@version`); empty: skipped. */
  installRef: process.env.E2E_INSTALL_REF ?? "",
  /** The server a credential is entered for. */
  credentialServer: process.env.E2E_CREDENTIAL_SERVER ?? "probe",
  screenshots:
    process.env.E2E_SCREENSHOTS ?? path.resolve(import.meta.dirname, "..", "e2e-artifacts", "screenshots"),
  /**
   * A profile of E2E_USER holding only the in-sandbox network probe (tests/fixtures/
   * netprobe_server.py), whose egress list allows `allowed` and not `denied` (a request
   * there is refused with `decision`). No token: the egress checks are skipped.
   */
  egress: {
    profile: process.env.E2E_EGRESS_PROFILE ?? "egress-alarm",
    token: process.env.E2E_EGRESS_TOKEN ?? "",
    server: process.env.E2E_EGRESS_SERVER ?? "netprobe",
    allowed: process.env.E2E_EGRESS_ALLOWED ?? "api.example.test",
    denied: process.env.E2E_EGRESS_DENIED ?? "blocked.example.test",
    decision: process.env.E2E_EGRESS_DECISION ?? "deny_host",
  },
};

export type Theme = "light" | "dark";
export const THEMES: readonly Theme[] = ["light", "dark"];
export const PHONE = { width: 375, height: 812 } as const;
export const DESKTOP = { width: 1280, height: 800 } as const;

/** Signs in through the real identity provider's login form; ends on the overview. */
export async function signIn(page: Page, username: string, password: string = username): Promise<void> {
  await page.goto("/login");
  await page.getByTestId("sign-in").click();
  await page.waitForURL((url) => url.pathname === "/authorize");
  if (E2E.idpURL !== "") {
    expect(page.url().startsWith(`${E2E.idpURL}/authorize?`), page.url()).toBe(true);
  }
  await page.locator("input[name=username]").fill(username);
  await page.locator("input[name=password]").fill(password);
  await page.locator("form button[type=submit]").click();
  await page.waitForURL(`${E2E.baseURL}/`);
  await expect(page.getByTestId("count-profiles")).toBeVisible();
}

export async function signOut(page: Page): Promise<void> {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.waitForURL(`${E2E.baseURL}/login`);
  await expect(page.getByTestId("sign-in")).toBeVisible();
}

/** Picks a theme with the switcher (its radios are visually hidden: click the label). */
export async function setTheme(page: Page, theme: Theme | "system"): Promise<void> {
  const switcher = page.getByTestId("theme-switcher").first();
  await switcher.locator(`label:has(input[name="theme"][value="${theme}"])`).click();
  await expect(switcher.locator(`input[name="theme"][value="${theme}"]`)).toBeChecked();
  if (theme === "dark") await expect(page.locator("html")).toHaveClass(/(^|\s)dark(\s|$)/);
  if (theme === "light") await expect(page.locator("html")).not.toHaveClass(/(^|\s)dark(\s|$)/);
}

/** The confirm (danger) button of the open Radix AlertDialog: the last of its buttons. */
export async function confirm(page: Page): Promise<void> {
  const dialog = page.getByRole("alertdialog");
  await expect(dialog).toBeVisible();
  await dialog.getByRole("button").last().click();
  await expect(dialog).toBeHidden();
}

/** The plaintext token shown once in the token dialog; closes the dialog. */
export async function takeToken(page: Page): Promise<string> {
  const value = page.getByTestId("token-value");
  await expect(value).toBeVisible();
  const token = await readValue(value);
  expect(token).toMatch(/^svc_\S+$/);
  await page.getByRole("dialog").getByTestId("token-done").click();
  await expect(value).toBeHidden();
  return token;
}

/** Text of an element, or the value of an input/textarea/select. */
export async function readValue(locator: Locator): Promise<string> {
  const tag = await locator.evaluate((element) => element.tagName);
  const text = ["INPUT", "TEXTAREA", "SELECT"].includes(tag) ? await locator.inputValue() : await locator.textContent();
  return (text ?? "").trim();
}

/** Fills an input, or picks the option of a select. */
export async function fillOrSelect(locator: Locator, value: string): Promise<void> {
  const tag = await locator.evaluate((element) => element.tagName);
  if (tag === "SELECT") await locator.selectOption(value);
  else await locator.fill(value);
}

/** Full-page screenshot to `<dir>/<name>.png`. */
export async function snap(page: Page, name: string): Promise<string> {
  mkdirSync(E2E.screenshots, { recursive: true });
  const file = path.join(E2E.screenshots, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true, animations: "disabled", caret: "hide" });
  return file;
}

export interface RecordedResponse {
  url: string;
  status: number;
  headers: string;
  body: string;
}

/**
 * Records every response the page receives (documents, scripts, RSC payloads, API calls):
 * headers and body. `all()` waits for the bodies still being read.
 */
export function recordResponses(page: Page): { all: () => Promise<RecordedResponse[]> } {
  const pending: Array<Promise<RecordedResponse>> = [];
  page.on("response", (response) => {
    pending.push(
      (async () => {
        const headers = JSON.stringify(await response.allHeaders().catch(() => ({})));
        // Redirects and aborted requests have no body.
        const body = await response.body().then(
          (buffer) => buffer.toString("utf8"),
          () => "",
        );
        return { url: response.url(), status: response.status(), headers, body };
      })(),
    );
  });
  return { all: () => Promise.all(pending) };
}

// -- MCP over the dashboard's /mcp rewrite -------------------------------------------------

export const MCP_ACCEPT = "application/json, text/event-stream";
export const MCP_PROTOCOL = "2025-06-18";

export interface JsonRpcMessage {
  jsonrpc: "2.0";
  id?: number | string | null;
  method?: string;
  params?: Record<string, unknown>;
  result?: Record<string, unknown>;
  error?: { code: number; message: string };
}

/** The JSON-RPC messages of a response: plain JSON or the events of an SSE stream. */
export async function messagesOf(response: APIResponse): Promise<JsonRpcMessage[]> {
  const type = response.headers()["content-type"] ?? "";
  const text = await response.text();
  if (type.startsWith("application/json")) return [JSON.parse(text) as JsonRpcMessage];
  expect(type, `unexpected content type, body: ${text.slice(0, 300)}`).toContain("text/event-stream");
  return text
    .split(/\r?\n/)
    .filter((line) => line.startsWith("data:") && line.slice(5).trim() !== "")
    .map((line) => JSON.parse(line.slice(5)) as JsonRpcMessage);
}

async function replyTo(response: APIResponse, id: number): Promise<JsonRpcMessage> {
  const messages = await messagesOf(response);
  const reply = messages.find((message) => message.id === id && (message.result || message.error));
  expect(reply, `no reply to request ${id} in ${JSON.stringify(messages)}`).toBeDefined();
  return reply as JsonRpcMessage;
}

export class McpSession {
  private nextId = 2;

  private constructor(
    private readonly request: APIRequestContext,
    readonly url: string,
    private readonly token: string,
    readonly sessionId: string,
    readonly initialized: JsonRpcMessage,
  ) {}

  private headers(): Record<string, string> {
    return {
      Authorization: `Bearer ${this.token}`,
      Accept: MCP_ACCEPT,
      "Content-Type": "application/json",
      "MCP-Protocol-Version": MCP_PROTOCOL,
      "Mcp-Session-Id": this.sessionId,
    };
  }

  /** `initialize` + `notifications/initialized`; fails the test unless both succeed. */
  static async open(request: APIRequestContext, url: string, token: string): Promise<McpSession> {
    const response = await initialize(request, url, token);
    expect(response.status(), await response.text()).toBe(200);
    const sessionId = response.headers()["mcp-session-id"];
    expect(sessionId, "initialize returned no Mcp-Session-Id").toBeTruthy();
    const initialized = await replyTo(response, 1);
    expect(initialized.error).toBeUndefined();
    const session = new McpSession(request, url, token, sessionId as string, initialized);
    const done = await request.post(url, {
      headers: session.headers(),
      data: { jsonrpc: "2.0", method: "notifications/initialized" },
    });
    expect(done.status(), await done.text()).toBe(202);
    return session;
  }

  async call(method: string, params: Record<string, unknown> = {}): Promise<JsonRpcMessage> {
    const id = this.nextId++;
    const response = await this.request.post(this.url, {
      headers: this.headers(),
      data: { jsonrpc: "2.0", id, method, params },
    });
    expect(response.status(), await response.text()).toBe(200);
    return replyTo(response, id);
  }

  async close(): Promise<void> {
    await this.request.delete(this.url, { headers: this.headers() });
  }
}

/** A raw `initialize` POST (for checking refusals, e.g. a rotated-out token's 401). */
export function initialize(request: APIRequestContext, url: string, token: string): Promise<APIResponse> {
  return request.post(url, {
    headers: {
      Authorization: `Bearer ${token}`,
      Accept: MCP_ACCEPT,
      "Content-Type": "application/json",
      "MCP-Protocol-Version": MCP_PROTOCOL,
    },
    data: {
      jsonrpc: "2.0",
      id: 1,
      method: "initialize",
      params: {
        protocolVersion: MCP_PROTOCOL,
        capabilities: {},
        clientInfo: { name: "svcgate-e2e", version: "1" },
      },
    },
  });
}

/** The text parts of a tools/call result. */
export function toolText(message: JsonRpcMessage): string {
  const content = (message.result?.content ?? []) as Array<{ type: string; text?: string }>;
  return content.map((part) => part.text ?? "").join("");
}
