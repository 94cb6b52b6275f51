/**
 * The dashboard's API client. Only relative `/api/...` paths: the browser talks to the
 * dashboard's own origin and Next rewrites `/api/:path*` to the gateway server-side.
 *
 * Every dynamic path segment goes through `encodeURIComponent` (see `path`), every
 * failure becomes an `ApiError` with the gateway's `{error: {code, message}}` envelope, and
 * a failure that is not the gateway's JSON (gateway down: the rewrite answers 500 with HTML,
 * or the network fails) becomes an `ApiError` with code `unavailable` or `network`.
 */
import type {
  AuditPage,
  CredentialMetadata,
  CredentialWrite,
  InstalledServer,
  Me,
  Profile,
  Server,
  User,
} from "./types";

export type ApiErrorCode =
  | "unauthenticated"
  | "forbidden"
  | "impersonating"
  | "not_found"
  | "method_not_allowed"
  | "invalid"
  | "conflict"
  | "internal"
  | "install_failed"
  | "uninstall_failed"
  | "control_plane_disabled"
  | "not_configured"
  | "unavailable"
  | "network"
  | (string & {});

export class ApiError extends Error {
  readonly status: number;
  readonly code: ApiErrorCode;

  constructor(status: number, code: ApiErrorCode, message: string) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }

  /** True when the gateway said so in its envelope (not a transport failure). */
  get fromGateway(): boolean {
    return this.code !== "unavailable" && this.code !== "network";
  }
}

export function isApiError(value: unknown): value is ApiError {
  return value instanceof ApiError;
}

/**
 * A path under `/api/` from literal parts and dynamic segments; each segment is encoded so
 * that `../`, `?`, `#` or `/` in a name can never change which route is called.
 */
export function path(strings: TemplateStringsArray, ...segments: Array<string | number>): string {
  let out = strings[0] ?? "";
  segments.forEach((segment, index) => {
    out += encodeURIComponent(String(segment)) + (strings[index + 1] ?? "");
  });
  if (!out.startsWith("/api/")) {
    throw new Error(`API paths are relative and under /api/: ${out}`);
  }
  return out;
}

function envelope(body: unknown): { code: string; message: string } | null {
  if (typeof body !== "object" || body === null || !("error" in body)) return null;
  const error = (body as { error: unknown }).error;
  if (typeof error !== "object" || error === null) return null;
  const { code, message } = error as { code?: unknown; message?: unknown };
  if (typeof code !== "string" || typeof message !== "string") return null;
  return { code, message };
}

export type Fetch = (input: string, init?: RequestInit) => Promise<Response>;

export interface RequestOptions {
  method?: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  body?: unknown;
  signal?: AbortSignal;
}

export async function request<T>(
  url: string,
  options: RequestOptions = {},
  fetchImpl: Fetch = (input, init) => fetch(input, init),
): Promise<T> {
  if (!url.startsWith("/api/")) {
    throw new Error(`API paths are relative and under /api/: ${url}`);
  }
  const init: RequestInit = {
    method: options.method ?? "GET",
    credentials: "same-origin",
    cache: "no-store",
    headers: { Accept: "application/json" },
    signal: options.signal,
  };
  if (options.body !== undefined) {
    init.headers = { ...init.headers, "Content-Type": "application/json" };
    init.body = JSON.stringify(options.body);
  }
  let response: Response;
  try {
    response = await fetchImpl(url, init);
  } catch (cause) {
    if (cause instanceof DOMException && cause.name === "AbortError") throw cause;
    throw new ApiError(0, "network", "The dashboard could not reach the gateway.");
  }
  const text = await response.text().catch(() => "");
  const type = response.headers.get("content-type") ?? "";
  let body: unknown = undefined;
  if (text !== "" && type.includes("application/json")) {
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
  }
  if (!response.ok) {
    const found = envelope(body);
    if (found) throw new ApiError(response.status, found.code, found.message);
    throw new ApiError(
      response.status,
      "unavailable",
      `The gateway did not answer (HTTP ${response.status}).`,
    );
  }
  if (response.status === 204 || text === "") return undefined as T;
  if (body === undefined) {
    throw new ApiError(response.status, "unavailable", "The gateway sent a response that is not JSON.");
  }
  return body as T;
}

export interface AuditQuery {
  before?: number;
  limit?: number;
  user_id?: number;
}

function query(params: Record<string, number | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined) search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/** Every route of the control plane the dashboard uses. */
export function createApi(fetchImpl?: Fetch) {
  const call = <T>(url: string, options?: RequestOptions) => request<T>(url, options, fetchImpl);
  return {
    me: (signal?: AbortSignal) => call<Me>("/api/me", { signal }),
    logout: () => call<void>("/api/auth/logout", { method: "POST" }),
    users: (signal?: AbortSignal) => call<User[]>("/api/users", { signal }),
    startViewAs: (userId: number, ttlMinutes = 60) =>
      call<void>("/api/admin/impersonate", {
        method: "POST",
        body: { user_id: userId, ttl_minutes: ttlMinutes },
      }),
    stopViewAs: () => call<void>("/api/admin/impersonate", { method: "DELETE" }),
    audit: (params: AuditQuery = {}, signal?: AbortSignal) =>
      call<AuditPage>(`/api/audit${query({ ...params })}`, { signal }),
    profiles: (signal?: AbortSignal) => call<Profile[]>("/api/profiles", { signal }),
    profile: (id: number | string, signal?: AbortSignal) =>
      call<Profile>(path`/api/profiles/${id}`, { signal }),
    createProfile: (name: string, slug: string) =>
      call<Profile>("/api/profiles", { method: "POST", body: { name, slug } }),
    renameProfile: (id: number | string, name: string) =>
      call<Profile>(path`/api/profiles/${id}`, { method: "PATCH", body: { name } }),
    deleteProfile: (id: number | string) =>
      call<void>(path`/api/profiles/${id}`, { method: "DELETE" }),
    setProfileServers: (id: number | string, servers: string[]) =>
      call<Profile>(path`/api/profiles/${id}/servers`, { method: "PUT", body: { servers } }),
    rotateToken: (id: number | string) =>
      call<Profile>(path`/api/profiles/${id}/token`, { method: "POST" }),
    credentials: (signal?: AbortSignal) =>
      call<CredentialMetadata[]>("/api/credentials", { signal }),
    putCredential: (server: string, body: CredentialWrite) =>
      call<void>(path`/api/credentials/${server}`, { method: "PUT", body }),
    deleteCredential: (server: string) =>
      call<void>(path`/api/credentials/${server}`, { method: "DELETE" }),
    servers: (signal?: AbortSignal) => call<Server[]>("/api/servers", { signal }),
    installServer: (ref: string, approvePermissions = false) =>
      call<InstalledServer>("/api/servers/install", {
        method: "POST",
        body: approvePermissions ? { ref, approve_permissions: true } : { ref },
      }),
    uninstallServer: (name: string) =>
      call<void>(path`/api/servers/${name}`, { method: "DELETE" }),
  };
}

export type Api = ReturnType<typeof createApi>;

export const api: Api = createApi();
