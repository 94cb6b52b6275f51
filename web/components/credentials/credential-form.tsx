"use client";

import { useTranslations } from "next-intl";
import { useId, useState, type FormEvent } from "react";

import { useSession } from "@/components/session";
import { Button } from "@/components/ui/button";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { Field, Input } from "@/components/ui/input";
import { InlineError } from "@/components/ui/states";
import { Textarea } from "@/components/ui/textarea";
import { api, ApiError } from "@/lib/api/client";
import {
  credentialBody,
  credentialFieldOf,
  credentialServer,
  EMPTY_CREDENTIAL_FORM,
  findInvalidHost,
  hasErrors,
  parseHosts,
  TOKEN_LITERAL,
  validateCredentialForm,
  type CredentialField,
  type CredentialForm as FormValues,
} from "@/lib/validation";

/**
 * Create or replace (PUT) the caller's credential for one server. The secret is write-only:
 * the field is cleared as soon as the gateway has it and it is never shown anywhere else.
 * `initial` prefills an edit (never with a secret: the dashboard does not have it).
 */
export function CredentialForm({
  initial,
  editing,
  serverNames,
  onSaved,
  onCancel,
}: {
  initial: FormValues;
  editing: boolean;
  serverNames: readonly string[];
  onSaved: (server: string) => void;
  onCancel: () => void;
}) {
  const t = useTranslations("credentials");
  const tc = useTranslations("common");
  const { readOnly } = useSession();
  const id = useId();
  const [form, setForm] = useState<FormValues>({ ...initial, secret: "" });
  const [submitted, setSubmitted] = useState(false);
  const [busy, setBusy] = useState(false);
  // The gateway's refusal: under the field it names, else under the form.
  const [serverError, setServerError] = useState<{ field: CredentialField | null; error: unknown } | null>(null);

  const errors = submitted ? validateCredentialForm(form) : {};

  function message(field: CredentialField): string | null {
    const key = errors[field];
    if (key) {
      if (key === "validation.hostInvalid" || key === "validation.hostTooLong") {
        return t(key, { host: findInvalidHost(parseHosts(form.hosts)) ?? "" });
      }
      if (key === "validation.formatToken") return t(key, { token: TOKEN_LITERAL });
      return t(key);
    }
    if (serverError?.field === field && serverError.error instanceof ApiError) return serverError.error.message;
    return null;
  }

  function change(field: CredentialField, value: string) {
    setForm((old) => ({ ...old, [field]: value }));
    setServerError(null);
  }

  async function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    setSubmitted(true);
    if (readOnly || busy || hasErrors(validateCredentialForm(form))) return;
    setBusy(true);
    setServerError(null);
    const server = credentialServer(form);
    try {
      await api.putCredential(server, credentialBody(form));
      // The secret leaves the page at once; the rest goes too (the list shows what was saved).
      setForm(EMPTY_CREDENTIAL_FORM);
      setSubmitted(false);
      onSaved(server);
    } catch (cause) {
      const field = cause instanceof ApiError && cause.code === "invalid" ? credentialFieldOf(cause.message) : null;
      setServerError({ field, error: cause });
    }
    setBusy(false);
  }

  const datalistId = `${id}-servers`;
  const formError = serverError && serverError.field === null ? serverError.error : null;

  return (
    <Card data-testid="credential-form-card">
      <CardHeader
        title={editing ? t("form.editTitle", { server: initial.server }) : t("form.title")}
        description={t("form.description")}
      />
      <form onSubmit={submit} noValidate className="flex flex-col gap-4" aria-label={t("form.title")} data-testid="credential-form">
        <div className="grid gap-4 sm:grid-cols-2">
          <Field label={t("form.server")} hint={t("form.serverHint")} error={message("server")}>
            {(props) => (
              <Input
                {...props}
                data-testid="cred-server"
                list={datalistId}
                value={form.server}
                onChange={(event) => change("server", event.target.value)}
                autoComplete="off"
                autoCapitalize="none"
                spellCheck={false}
                className="font-mono"
              />
            )}
          </Field>
          <datalist id={datalistId}>
            {serverNames.map((name) => (
              <option key={name} value={name} />
            ))}
          </datalist>
          <Field label={t("form.secret")} hint={editing ? t("form.secretHintEdit") : t("form.secretHint")} error={message("secret")}>
            {(props) => (
              <Input
                {...props}
                data-testid="cred-secret"
                type="password"
                autoComplete="off"
                autoCapitalize="none"
                spellCheck={false}
                autoFocus={editing}
                value={form.secret}
                onChange={(event) => change("secret", event.target.value)}
              />
            )}
          </Field>
        </div>
        <fieldset className="min-w-0 rounded-md border p-3">
          <legend className="px-1 text-sm font-medium">{t("form.injection")}</legend>
          <p className="text-xs text-muted-foreground">{t("form.injectionHint")}</p>
          <div className="mt-3 grid gap-4 sm:grid-cols-2">
            <Field label={t("form.header")} hint={t("form.headerHint")} error={message("header")}>
              {(props) => (
                <Input
                  {...props}
                  data-testid="cred-header"
                  value={form.header}
                  onChange={(event) => change("header", event.target.value)}
                  autoComplete="off"
                  spellCheck={false}
                  placeholder="Authorization"
                  className="font-mono"
                />
              )}
            </Field>
            <Field label={t("form.format")} hint={t("form.formatHint", { token: TOKEN_LITERAL })} error={message("format")}>
              {(props) => (
                <Input
                  {...props}
                  data-testid="cred-format"
                  value={form.format}
                  onChange={(event) => change("format", event.target.value)}
                  autoComplete="off"
                  spellCheck={false}
                  placeholder={`Bearer ${TOKEN_LITERAL}`}
                  className="font-mono"
                />
              )}
            </Field>
            <Field label={t("form.placeholder")} hint={t("form.placeholderHint")} error={message("placeholder")}>
              {(props) => (
                <Input
                  {...props}
                  data-testid="cred-placeholder"
                  value={form.placeholder}
                  onChange={(event) => change("placeholder", event.target.value)}
                  autoComplete="off"
                  spellCheck={false}
                  className="font-mono"
                />
              )}
            </Field>
            <Field label={t("form.hosts")} hint={t("form.hostsHint")} error={message("hosts")}>
              {(props) => (
                <Textarea
                  {...props}
                  data-testid="cred-hosts"
                  value={form.hosts}
                  onChange={(event) => change("hosts", event.target.value)}
                  autoComplete="off"
                  autoCapitalize="none"
                  spellCheck={false}
                  rows={3}
                  placeholder={"api.example.com\n*.example.com"}
                  className="font-mono"
                />
              )}
            </Field>
          </div>
        </fieldset>
        <InlineError error={formError} />
        <div className="flex flex-wrap gap-2">
          <MutationButton
            type="submit"
            data-testid="save-credential"
            disabled={busy}
          >
            {busy ? tc("saving") : t("form.submit")}
          </MutationButton>
          {editing ? (
            <Button variant="ghost" onClick={onCancel} data-testid="cancel-edit">
              {tc("cancel")}
            </Button>
          ) : null}
        </div>
      </form>
    </Card>
  );
}
