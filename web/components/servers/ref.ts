/**
 * Registry refs as the gateway parses them (`svcgate/registry/index.py`, `_REF`): a server
 * name (`^[a-z0-9][a-z0-9-]{0,63}$`, no `_`), optionally `@` and a non-empty version without
 * whitespace (at most 64 characters). A bare name installs the newest release.
 */
const REF = /^([a-z0-9][a-z0-9-]{0,63})(?:@(\S{1,64}))?$/;

export interface RegistryRef {
  name: string;
  version: string | null;
}

/** The parsed ref, or null when the gateway would refuse it as `invalid`. */
export function parseRef(text: string): RegistryRef | null {
  const match = REF.exec(text.trim());
  if (!match) return null;
  return { name: match[1] ?? "", version: match[2] ?? null };
}

/** `sha256:0123456789abcdef…` shortened to the algorithm and 12 hex digits. */
export function shortDigest(digest: string): string {
  const [algorithm, hex] = digest.includes(":") ? digest.split(":", 2) : ["", digest];
  if (!hex || hex.length <= 12) return digest;
  return algorithm ? `${algorithm}:${hex.slice(0, 12)}` : hex.slice(0, 12);
}

/** A refused upgrade that widens permissions: repeating it with the approval flag installs it. */
export function needsApproval(error: { code: string; message: string }): boolean {
  return error.code === "install_failed" && /approve_permissions|widens its permissions/i.test(error.message);
}
