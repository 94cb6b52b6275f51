import { describe, expect, it } from "vitest";

import { ApiError, createApi, path, request, type Fetch } from "@/lib/api/client";

interface Call {
  url: string;
  init: RequestInit | undefined;
}

function fakeFetch(respond: (url: string) => Response | Promise<Response>): { fetch: Fetch; calls: Call[] } {
  const calls: Call[] = [];
  return {
    calls,
    fetch: async (url, init) => {
      calls.push({ url, init });
      return respond(url);
    },
  };
}

const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });

describe("path", () => {
  it("encodes every dynamic segment", () => {
    expect(path`/api/credentials/${"a/../b?c#d"}`).toBe("/api/credentials/a%2F..%2Fb%3Fc%23d");
    expect(path`/api/profiles/${12}/token`).toBe("/api/profiles/12/token");
    expect(path`/api/servers/${".."}`).toBe("/api/servers/..");
  });

  it("refuses anything that is not a relative /api/ path", () => {
    expect(() => path`https://evil.example/api/${"x"}`).toThrow();
    expect(() => path`/mcp/${"x"}`).toThrow();
  });
});

describe("createApi", () => {
  it("calls relative /api/ paths only, with encoded segments", async () => {
    const { fetch, calls } = fakeFetch(() => new Response(null, { status: 204 }));
    const api = createApi(fetch);
    await api.deleteCredential("git hub/x");
    await api.uninstallServer("a?b");
    await api.deleteProfile("7#x");
    await api.audit({ before: 120, limit: 50 });
    expect(calls.map((call) => call.url)).toEqual([
      "/api/credentials/git%20hub%2Fx",
      "/api/servers/a%3Fb",
      "/api/profiles/7%23x",
      "/api/audit?before=120&limit=50",
    ]);
    for (const call of calls) {
      expect(call.url.startsWith("/api/")).toBe(true);
      expect(call.init?.credentials).toBe("same-origin");
    }
  });

  it("sends JSON bodies with a JSON content type", async () => {
    const { fetch, calls } = fakeFetch(() => json(201, { id: 1 }));
    await createApi(fetch).createProfile("Mine", "mine");
    const init = calls[0]?.init;
    expect(init?.method).toBe("POST");
    expect(init?.body).toBe(JSON.stringify({ name: "Mine", slug: "mine" }));
    expect((init?.headers as Record<string, string>)["Content-Type"]).toBe("application/json");
  });

  it("asks for approval only when told to", async () => {
    const { fetch, calls } = fakeFetch(() => json(201, {}));
    const api = createApi(fetch);
    await api.installServer("notes@1.0.0");
    await api.installServer("notes@1.1.0", true);
    expect(calls.map((call) => call.init?.body)).toEqual([
      JSON.stringify({ ref: "notes@1.0.0" }),
      JSON.stringify({ ref: "notes@1.1.0", approve_permissions: true }),
    ]);
  });
});

describe("request errors", () => {
  it("turns the error envelope into a typed ApiError", async () => {
    const { fetch } = fakeFetch(() => json(409, { error: { code: "conflict", message: "slug taken" } }));
    const error = await request("/api/profiles", { method: "POST", body: {} }, fetch).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error).toMatchObject({ status: 409, code: "conflict", message: "slug taken", fromGateway: true });
  });

  it("keeps control_plane_disabled distinguishable", async () => {
    const { fetch } = fakeFetch(() =>
      json(404, { error: { code: "control_plane_disabled", message: "set SVC_OIDC_ISSUER" } }),
    );
    await expect(request("/api/me", {}, fetch)).rejects.toMatchObject({ code: "control_plane_disabled", status: 404 });
  });

  it("turns a non-JSON failure (gateway down behind the rewrite) into `unavailable`", async () => {
    const { fetch } = fakeFetch(
      () => new Response("<html>Internal Server Error</html>", { status: 500, headers: { "Content-Type": "text/html" } }),
    );
    const error = await request("/api/me", {}, fetch).catch((e: unknown) => e);
    expect(error).toMatchObject({ status: 500, code: "unavailable", fromGateway: false });
  });

  it("treats a JSON body without the envelope shape as unavailable, not as the gateway's word", async () => {
    const { fetch } = fakeFetch(() => json(502, { error: "bad gateway" }));
    await expect(request("/api/me", {}, fetch)).rejects.toMatchObject({ code: "unavailable", status: 502 });
  });

  it("turns a network failure into `network`", async () => {
    const fetch: Fetch = async () => {
      throw new TypeError("fetch failed");
    };
    await expect(request("/api/me", {}, fetch)).rejects.toMatchObject({ code: "network", status: 0 });
  });

  it("passes an abort through untouched", async () => {
    const fetch: Fetch = async () => {
      throw new DOMException("aborted", "AbortError");
    };
    await expect(request("/api/me", {}, fetch)).rejects.toMatchObject({ name: "AbortError" });
  });

  it("refuses a 200 that is not JSON", async () => {
    const { fetch } = fakeFetch(() => new Response("<html></html>", { status: 200, headers: { "Content-Type": "text/html" } }));
    await expect(request("/api/me", {}, fetch)).rejects.toMatchObject({ code: "unavailable" });
  });

  it("returns undefined for 204", async () => {
    const { fetch } = fakeFetch(() => new Response(null, { status: 204 }));
    await expect(request("/api/credentials/x", { method: "DELETE" }, fetch)).resolves.toBeUndefined();
  });

  it("refuses absolute URLs", async () => {
    const { fetch } = fakeFetch(() => json(200, {}));
    await expect(request("http://gateway:8080/api/me", {}, fetch)).rejects.toThrow(/relative/);
  });
});
