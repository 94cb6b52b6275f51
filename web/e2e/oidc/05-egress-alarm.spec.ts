/**
 * A real egress denial is alarming (SPEC: recent activity with decision badges, egress
 * decisions other than `allow` visibly alarming). Bob's profile E2E_EGRESS_PROFILE holds only
 * the in-sandbox network probe; from its sandbox, a request through the egress proxy to a
 * host its egress list does not name (E2E_EGRESS_DENIED) is refused with
 * E2E_EGRESS_DECISION, one to the host it names (E2E_EGRESS_ALLOWED) is allowed. Once both
 * decisions are in the audit log, the Overview's recent activity and /audit mark the
 * denial's row as an alarm (data-alarm, a tinted row, a danger badge with ⚠ and the
 * decision) and the allowed row not.
 *
 * The orchestrator already checks that such decisions reach GET /api/audit; they are sent
 * again here because the Overview lists only the ten newest events and the specs before
 * this one add more than ten of bob's.
 */
import { expect, test, type Locator, type Page } from "@playwright/test";

import { E2E, McpSession, signIn, snap, toolText } from "../support";

interface AuditEvent {
  id: number;
  kind: string;
  server: string;
  host: string;
  decision: string;
}

const { egress } = E2E;

/**
 * From the sandbox: a plain GET for http://<host>/ sent to the egress proxy (HTTP_PROXY).
 * `decision` is the proxy's X-Svcgate-Egress header: set on its own refusals only (an allowed
 * request gets the upstream's reply, here a 200 "ok").
 */
async function proxyGet(session: McpSession, host: string): Promise<{ status: number; decision: string; body: string }> {
  const raw = `GET http://${host}/ HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`;
  const reply = await session.call("tools/call", {
    name: `${egress.server}_raw_proxy`,
    arguments: { data_b64: Buffer.from(raw).toString("base64"), timeout: 10 },
  });
  expect(reply.error).toBeUndefined();
  expect(reply.result?.isError, toolText(reply)).toBeFalsy();
  const answer = JSON.parse(toolText(reply)) as { ok: boolean; response_b64: string };
  expect(answer.ok, toolText(reply)).toBe(true);
  const text = Buffer.from(answer.response_b64, "base64").toString("latin1");
  const split = text.indexOf("\r\n\r\n");
  const [statusLine = "", ...headers] = text.slice(0, split).split("\r\n");
  const decision = headers.find((line) => line.toLowerCase().startsWith("x-svcgate-egress:")) ?? "";
  return {
    status: Number(statusLine.split(" ")[1]),
    decision: decision.slice(decision.indexOf(":") + 1).trim(),
    body: text.slice(split + 4),
  };
}

/** The viewer's audit events (newest first), through the dashboard with the page's cookies. */
async function auditEvents(page: Page, limit: number): Promise<AuditEvent[]> {
  const response = await page.request.get(`/api/audit?limit=${limit}`);
  expect(response.status(), await response.text()).toBe(200);
  return ((await response.json()) as { events: AuditEvent[] }).events;
}

function row(page: Page, event: AuditEvent): Locator {
  return page.locator(`[data-testid="audit-row"][data-event-id="${event.id}"]`);
}

function decisionBadge(row: Locator, decision: string): Locator {
  return row.locator("[data-tone]").filter({ hasText: decision });
}

const background = (locator: Locator) => locator.evaluate((element) => getComputedStyle(element).backgroundColor);

/** The denial is an alarm, the allowed request is not, and the two look different. */
async function expectAlarm(page: Page, denied: AuditEvent, allowed: AuditEvent): Promise<void> {
  const deniedRow = row(page, denied);
  await expect(deniedRow).toBeVisible();
  await expect(deniedRow).toHaveAttribute("data-kind", "egress");
  await expect(deniedRow).toHaveAttribute("data-alarm", "true");
  const deniedBadge = decisionBadge(deniedRow, egress.decision);
  await expect(deniedBadge).toHaveCount(1);
  await expect(deniedBadge).toHaveAttribute("data-tone", "danger");
  // The ⚠ is its own (aria-hidden) span before the decision text.
  await expect(deniedBadge).toHaveText(new RegExp(`^⚠\\s*${egress.decision}$`));
  await expect(deniedBadge.locator('span[aria-hidden="true"]')).toHaveText("⚠");

  const allowedRow = row(page, allowed);
  await expect(allowedRow).toBeVisible();
  await expect(allowedRow).toHaveAttribute("data-kind", "egress");
  await expect(allowedRow).not.toHaveAttribute("data-alarm");
  const allowedBadge = decisionBadge(allowedRow, "allow");
  await expect(allowedBadge).toHaveCount(1);
  await expect(allowedBadge).toHaveAttribute("data-tone", "ok");
  await expect(allowedBadge).toHaveText("allow");

  // Visibly: the alarming row and badge are not styled like the allowed ones.
  expect(await background(deniedRow)).not.toBe(await background(allowedRow));
  expect(await background(deniedBadge)).not.toBe(await background(allowedBadge));
}

test("a real egress denial from a sandbox is alarming on the Overview and in the audit log", async ({
  page,
  request,
}) => {
  test.skip(egress.token === "", "no egress profile (E2E_EGRESS_TOKEN)");
  await signIn(page, E2E.user);
  const start = (await auditEvents(page, 1))[0]?.id ?? 0;

  await test.step("the sandbox asks the egress proxy for a denied and an allowed host", async () => {
    const session = await McpSession.open(request, `${E2E.baseURL}/mcp/p/${egress.profile}`, egress.token);
    expect(await proxyGet(session, egress.denied)).toMatchObject({ status: 403, decision: egress.decision });
    expect(await proxyGet(session, egress.allowed)).toMatchObject({ status: 200, decision: "", body: "ok\n" });
    await session.close();
  });

  let found: Array<AuditEvent | undefined> = [];
  await test.step("both decisions reach the audit log (written in batches: polled)", async () => {
    await expect
      .poll(
        async () => {
          const fresh = (await auditEvents(page, 100)).filter(
            (event) => event.id > start && event.kind === "egress" && event.server === egress.server,
          );
          found = [
            fresh.find((event) => event.host === egress.denied && event.decision === egress.decision),
            fresh.find((event) => event.host === egress.allowed && event.decision === "allow"),
          ];
          return found.map((event) => event !== undefined);
        },
        { message: "the egress decisions in GET /api/audit" },
      )
      .toEqual([true, true]);
  });
  const [denied, allowed] = found as [AuditEvent, AuditEvent];

  await test.step("Overview: recent activity", async () => {
    await page.goto("/");
    await expect(page.getByTestId("audit-table")).toBeVisible();
    await expectAlarm(page, denied, allowed);
    await snap(page, "overview-egress-alarm");
  });

  await test.step("the audit log", async () => {
    await page.goto("/audit");
    await expect(page.getByTestId("audit-table")).toBeVisible();
    await expectAlarm(page, denied, allowed);
    await expect(row(page, denied)).toContainText(egress.denied);
    await expect(row(page, allowed)).toContainText(egress.allowed);
  });
});
