#!/usr/bin/env node
// The official TypeScript MCP SDK client as a one-shot command line tool for the tests.
//
//   node ts_client.mjs --url URL [--token TOKEN] [--call TOOL [--args JSON]] [--progress]
//                      [--list-prompts] [--list-resources] [--read URI]
//                      [--sampling-reply TEXT] [--tool-details] [--timeout MS] [--keep-session]
//
// Connects over Streamable HTTP (Authorization: Bearer TOKEN on every request), initializes,
// lists every tool (following nextCursor), then does what the flags ask, in that order:
// prompts, resources, the read, the call. Prints ONE JSON object on stdout and exits 0:
//
//   {"protocolVersion", "serverInfo", "capabilities", "sessionId", "tools": [names],
//    "toolList": [tools] (--tool-details), "prompts": [names], "resources": [uris],
//    "read": result, "call": result, "progress": [params] (--progress),
//    "sampling": [params] (--sampling-reply), "terminated": bool}
//
// On any failure prints {"error": message, "name": error class, "code": code?, "cause": ...}
// and exits 1 (an HTTP status from the transport is the code).
// --sampling-reply declares the sampling capability and answers every
// sampling/createMessage request with TEXT. --keep-session skips the closing DELETE.
import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CreateMessageRequestSchema } from "@modelcontextprotocol/sdk/types.js";

function fail(error) {
  const out = { error: error instanceof Error ? error.message : String(error) };
  if (error instanceof Error) out.name = error.constructor?.name ?? error.name;
  if (error && typeof error === "object" && "code" in error) out.code = error.code;
  // fetch failures carry the socket error (ECONNREFUSED ...) in their cause.
  if (error instanceof Error && error.cause) out.cause = String(error.cause.code ?? error.cause);
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exitCode = 1;
}

async function listAll(fetchPage, key) {
  const items = [];
  let cursor;
  do {
    const page = await fetchPage(cursor === undefined ? {} : { cursor });
    items.push(...page[key]);
    cursor = page.nextCursor;
  } while (cursor);
  return items;
}

async function main() {
  const { values } = parseArgs({
    options: {
      url: { type: "string" },
      token: { type: "string" },
      call: { type: "string" },
      args: { type: "string", default: "{}" },
      progress: { type: "boolean", default: false },
      "list-prompts": { type: "boolean", default: false },
      "list-resources": { type: "boolean", default: false },
      read: { type: "string" },
      "sampling-reply": { type: "string" },
      "tool-details": { type: "boolean", default: false },
      timeout: { type: "string", default: "30000" },
      "keep-session": { type: "boolean", default: false },
    },
    strict: true,
  });
  if (!values.url) throw new Error("--url is required");
  const toolArgs = JSON.parse(values.args);
  const timeout = Number(values.timeout);
  const requestOptions = { timeout };

  const headers = {};
  if (values.token !== undefined) headers.Authorization = `Bearer ${values.token}`;
  const transport = new StreamableHTTPClientTransport(new URL(values.url), {
    requestInit: { headers },
  });

  const capabilities = {};
  if (values["sampling-reply"] !== undefined) capabilities.sampling = {};
  const client = new Client({ name: "svcgate-ts-client", version: "1.0.0" }, { capabilities });

  const out = {};
  const sampling = [];
  if (values["sampling-reply"] !== undefined) {
    client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
      sampling.push(request.params);
      return {
        role: "assistant",
        content: { type: "text", text: values["sampling-reply"] },
        model: "svcgate-ts-client",
        stopReason: "endTurn",
      };
    });
  }

  await client.connect(transport, requestOptions);
  try {
    out.protocolVersion = transport.protocolVersion ?? null;
    out.serverInfo = client.getServerVersion() ?? null;
    out.capabilities = client.getServerCapabilities() ?? null;
    out.sessionId = transport.sessionId ?? null;

    const tools = await listAll((p) => client.listTools(p, requestOptions), "tools");
    out.tools = tools.map((t) => t.name);
    if (values["tool-details"]) out.toolList = tools;

    if (values["list-prompts"]) {
      const prompts = await listAll((p) => client.listPrompts(p, requestOptions), "prompts");
      out.prompts = prompts.map((p) => p.name);
    }
    if (values["list-resources"]) {
      const resources = await listAll((p) => client.listResources(p, requestOptions), "resources");
      out.resources = resources.map((r) => r.uri);
    }
    if (values.read !== undefined) {
      out.read = await client.readResource({ uri: values.read }, requestOptions);
    }
    if (values.call !== undefined) {
      const progress = [];
      const options = { ...requestOptions };
      if (values.progress) options.onprogress = (p) => progress.push(p);
      out.call = await client.callTool(
        { name: values.call, arguments: toolArgs },
        undefined,
        options,
      );
      if (values.progress) out.progress = progress;
    }
    if (values["sampling-reply"] !== undefined) out.sampling = sampling;

    out.terminated = false;
    if (!values["keep-session"] && transport.sessionId !== undefined) {
      await transport.terminateSession();
      out.terminated = true;
    }
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch(fail);
