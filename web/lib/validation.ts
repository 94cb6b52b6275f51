/**
 * Client-side checks of the profile and credential forms (pure: no React, no I/O).
 *
 * The rules are the SPEC's (Profile and Credential resources, Limits); the gateway checks
 * them again and more (e.g. over-broad host wildcards), so these only spare a round trip and
 * explain the problem beside the field. Each validator returns a message key (under
 * `profiles.validation.*` or `credentials.validation.*`) or null when the value is fine.
 */
import type { CredentialWrite } from "@/lib/api/types";

// ---------------------------------------------------------------------------------------
// Profiles

export const PROFILE_NAME_MAX = 128;
export const SLUG_PATTERN = /^[a-z0-9][a-z0-9-]{1,62}$/;
export const SLUG_MIN = 2;
export const SLUG_MAX = 63;

export type ProfileNameError = "validation.nameRequired" | "validation.nameTooLong" | "validation.nameControl";
export type SlugError = "validation.slugRequired" | "validation.slugLength" | "validation.slugStart" | "validation.slugChars";

// C0 controls and DEL, as the gateway refuses them in names and placeholders.
const CONTROL = /[\u0000-\u001f\u007f]/;
const LINE_BREAK_OR_NUL = /[\r\n\u0000]/;

/** Length in characters (code points), as the gateway counts them, not UTF-16 units. */
export function charCount(value: string): number {
  return Array.from(value).length;
}

/** UTF-8 size in bytes. */
export function utf8Bytes(value: string): number {
  return new TextEncoder().encode(value).length;
}

export function validateProfileName(name: string): ProfileNameError | null {
  if (name.trim() === "") return "validation.nameRequired";
  if (charCount(name) > PROFILE_NAME_MAX) return "validation.nameTooLong";
  if (CONTROL.test(name)) return "validation.nameControl";
  return null;
}

export function validateSlug(slug: string): SlugError | null {
  if (slug === "") return "validation.slugRequired";
  if (SLUG_PATTERN.test(slug)) return null;
  if (/^[a-z0-9-]*$/.test(slug)) {
    if (slug.length < SLUG_MIN || slug.length > SLUG_MAX) return "validation.slugLength";
    return "validation.slugStart";
  }
  return "validation.slugChars";
}

const TRANSLITERATION: Record<string, string> = { ä: "ae", ö: "oe", ü: "ue", ß: "ss", æ: "ae", ø: "o", œ: "oe", đ: "d", ł: "l", þ: "th" };

/**
 * A slug suggested from a display name: lower case, accents dropped (German umlauts spelled
 * out), every other run of characters a single `-`, no leading or trailing `-`, at most 63
 * characters. May still be too short (a one-letter name); the slug validator says so.
 */
export function slugFromName(name: string): string {
  const spelled = name
    .toLowerCase()
    .replace(/[äöüßæøœđłþ]/g, (c) => TRANSLITERATION[c] ?? c)
    .normalize("NFKD")
    .replace(/[\u0300-\u036f]/g, "");
  return spelled
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+/, "")
    .slice(0, SLUG_MAX)
    .replace(/-+$/, "");
}

// ---------------------------------------------------------------------------------------
// Credentials

export const SERVER_NAME_PATTERN = /^[a-z0-9][a-z0-9_-]{0,63}$/;
export const SERVER_NAME_MAX = 64;
export const HEADER_PATTERN = /^[A-Za-z0-9-]+$/;
export const HEADER_MAX = 64;
export const FORMAT_MAX = 256;
export const TOKEN_LITERAL = "{token}";
export const PLACEHOLDER_MIN = 8;
export const PLACEHOLDER_MAX = 256;
export const HOST_PATTERN = /^(\*\.)?[a-z0-9.-]+$/;
export const HOST_MAX = 253;
export const HOSTS_MAX = 64;
export const SECRET_MAX_BYTES = 64 * 1024;

export type ServerNameError =
  | "validation.serverRequired"
  | "validation.serverTooLong"
  | "validation.serverStart"
  | "validation.serverChars";
export type SecretError = "validation.secretRequired" | "validation.secretTooLarge" | "validation.secretLineBreak";
export type HeaderError = "validation.headerChars" | "validation.headerTooLong";
export type FormatError = "validation.formatTooLong" | "validation.formatToken" | "validation.formatLineBreak";
export type PlaceholderError = "validation.placeholderLength" | "validation.placeholderControl";
export type HostsError = "validation.hostsTooMany" | "validation.hostTooLong" | "validation.hostInvalid";
export type CredentialError = ServerNameError | SecretError | HeaderError | FormatError | PlaceholderError | HostsError;

export function validateServerName(name: string): ServerNameError | null {
  if (name === "") return "validation.serverRequired";
  if (SERVER_NAME_PATTERN.test(name)) return null;
  if (/^[a-z0-9_-]*$/.test(name)) {
    return name.length > SERVER_NAME_MAX ? "validation.serverTooLong" : "validation.serverStart";
  }
  return "validation.serverChars";
}

export function validateSecret(secret: string): SecretError | null {
  if (secret === "") return "validation.secretRequired";
  if (utf8Bytes(secret) > SECRET_MAX_BYTES) return "validation.secretTooLarge";
  if (LINE_BREAK_OR_NUL.test(secret)) return "validation.secretLineBreak";
  return null;
}

/** Optional: the empty string means "not set". */
export function validateInjectHeader(header: string): HeaderError | null {
  if (header === "") return null;
  if (!HEADER_PATTERN.test(header)) return "validation.headerChars";
  if (header.length > HEADER_MAX) return "validation.headerTooLong";
  return null;
}

/** Optional: the empty string means "not set". */
export function validateInjectFormat(format: string): FormatError | null {
  if (format === "") return null;
  if (charCount(format) > FORMAT_MAX) return "validation.formatTooLong";
  if (LINE_BREAK_OR_NUL.test(format)) return "validation.formatLineBreak";
  if (!format.includes(TOKEN_LITERAL)) return "validation.formatToken";
  return null;
}

/** Optional: the empty string means "not set". */
export function validatePlaceholder(placeholder: string): PlaceholderError | null {
  if (placeholder === "") return null;
  const length = charCount(placeholder);
  if (length < PLACEHOLDER_MIN || length > PLACEHOLDER_MAX) return "validation.placeholderLength";
  if (CONTROL.test(placeholder)) return "validation.placeholderControl";
  return null;
}

/** One host pattern: null when fine. */
export function validateHost(host: string): "validation.hostTooLong" | "validation.hostInvalid" | null {
  if (host.length > HOST_MAX) return "validation.hostTooLong";
  if (!HOST_PATTERN.test(host)) return "validation.hostInvalid";
  return null;
}

/** The first refused entry (to name it in the message), or undefined. */
export function findInvalidHost(hosts: readonly string[]): string | undefined {
  return hosts.find((host) => validateHost(host) !== null);
}

export function validateAllowedHosts(hosts: readonly string[]): HostsError | null {
  if (hosts.length > HOSTS_MAX) return "validation.hostsTooMany";
  for (const host of hosts) {
    const error = validateHost(host);
    if (error) return error;
  }
  return null;
}

/** Hosts typed one per line or comma-separated: trimmed, blanks dropped, duplicates dropped. */
export function parseHosts(text: string): string[] {
  const out: string[] = [];
  for (const part of text.split(/[\n\r,]+/)) {
    const host = part.trim();
    if (host !== "" && !out.includes(host)) out.push(host);
  }
  return out;
}

/** The credential form as typed (all strings; hosts as the textarea's text). */
export interface CredentialForm {
  server: string;
  secret: string;
  header: string;
  format: string;
  placeholder: string;
  hosts: string;
}

export type CredentialField = keyof CredentialForm;
export type CredentialErrors = Partial<Record<CredentialField, CredentialError>>;

export const EMPTY_CREDENTIAL_FORM: CredentialForm = {
  server: "",
  secret: "",
  header: "",
  format: "",
  placeholder: "",
  hosts: "",
};

/** The optional text fields as sent: surrounding blanks dropped (none is meaningful there). */
function optional(value: string): string {
  return value.trim();
}

/** Every field's first problem; an empty object when the form can be sent. */
export function validateCredentialForm(form: CredentialForm): CredentialErrors {
  const errors: CredentialErrors = {};
  const server = validateServerName(form.server.trim());
  if (server) errors.server = server;
  const secret = validateSecret(form.secret);
  if (secret) errors.secret = secret;
  const header = validateInjectHeader(optional(form.header));
  if (header) errors.header = header;
  const format = validateInjectFormat(optional(form.format));
  if (format) errors.format = format;
  const placeholder = validatePlaceholder(optional(form.placeholder));
  if (placeholder) errors.placeholder = placeholder;
  const hosts = validateAllowedHosts(parseHosts(form.hosts));
  if (hosts) errors.hosts = hosts;
  return errors;
}

export function hasErrors(errors: object): boolean {
  return Object.values(errors).some((value) => value !== null && value !== undefined);
}

/** The PUT body: `secret` as typed, every empty optional field left out. */
export function credentialBody(form: CredentialForm): CredentialWrite {
  const body: CredentialWrite = { secret: form.secret };
  const header = optional(form.header);
  if (header !== "") body.inject_header = header;
  const format = optional(form.format);
  if (format !== "") body.inject_format = format;
  const placeholder = optional(form.placeholder);
  if (placeholder !== "") body.placeholder = placeholder;
  const hosts = parseHosts(form.hosts);
  if (hosts.length > 0) body.allowed_hosts = hosts;
  return body;
}

/** The server name as sent (the path segment). */
export function credentialServer(form: CredentialForm): string {
  return form.server.trim();
}

const SERVER_FIELDS: Record<string, CredentialField> = {
  server: "server",
  secret: "secret",
  inject_header: "header",
  inject_format: "format",
  placeholder: "placeholder",
  allowed_hosts: "hosts",
};

/**
 * The form field a gateway `invalid` message is about (its messages start with the body
 * field's name, e.g. `allowed_hosts: ...` or `inject_header must ...`), or null.
 */
export function credentialFieldOf(message: string): CredentialField | null {
  const match = /^(server|secret|inject_header|inject_format|placeholder|allowed_hosts)\b/.exec(message);
  return match ? (SERVER_FIELDS[match[1] ?? ""] ?? null) : null;
}
