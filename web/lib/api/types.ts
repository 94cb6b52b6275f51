/**
 * The dashboard's names for the gateway's types, all taken from the generated `schema.ts`
 * (itself generated from the gateway's OpenAPI document), so a changed field in the gateway
 * breaks the type check here instead of a page at run time.
 */
import type { components, operations } from "./schema";

type Schemas = components["schemas"];
type JsonBody<Op extends keyof operations> = operations[Op] extends {
  requestBody: { content: { "application/json": infer B } };
}
  ? B
  : operations[Op] extends { requestBody?: { content: { "application/json": infer B } } }
    ? B
    : never;

export type User = Schemas["User"];
export type Me = Schemas["Me"];
export type Profile = Schemas["Profile"];
export type Runtime = Schemas["Runtime"];
export type RuntimeServer = Runtime["servers"][number];
export type Server = Schemas["Server"];
export type InstalledServer = Schemas["InstalledServer"];
export type CredentialMetadata = Schemas["CredentialMetadata"];
export type AuditEvent = Schemas["AuditEvent"];
export type AuditKind = AuditEvent["kind"];
export type AuditPage = Schemas["AuditPage"];
export type ErrorEnvelope = Schemas["Error"];

export type CredentialWrite = JsonBody<"credentials_put_credential">;
export type ProfileCreate = JsonBody<"profiles_create_profile">;
