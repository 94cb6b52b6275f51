"use client";

import { useTranslations } from "next-intl";
import type { FormEvent } from "react";
import { useId, useState } from "react";

import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { Field, Input } from "@/components/ui/input";
import { InlineError } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import type { InstalledServer } from "@/lib/api/types";

import { needsApproval, parseRef, shortDigest } from "./ref";

type Outcome =
  | { kind: "idle" }
  | { kind: "installed"; server: InstalledServer }
  /** A refused upgrade that widens permissions; `ref` is what the admin may approve. */
  | { kind: "approval"; ref: string; message: string }
  | { kind: "notConfigured" }
  | { kind: "error"; error: unknown };

/** Admins' install form: a registry ref, checked here first, then `POST /api/servers/install`. */
export function InstallForm({ readOnly, onInstalled }: { readOnly: boolean; onInstalled: () => void }) {
  const t = useTranslations("servers.install");
  const common = useTranslations("common");
  const [ref, setRef] = useState("");
  const [refError, setRefError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [outcome, setOutcome] = useState<Outcome>({ kind: "idle" });
  const titleId = useId();
  const readOnlyTitle = readOnly ? common("viewAs.readOnlyHint") : undefined;

  async function install(text: string, approve: boolean) {
    setBusy(true);
    setOutcome({ kind: "idle" });
    try {
      const server = await api.installServer(text, approve);
      setOutcome({ kind: "installed", server });
      setRef("");
      onInstalled();
    } catch (error) {
      if (error instanceof ApiError && (error.code === "not_configured" || error.status === 501)) {
        setOutcome({ kind: "notConfigured" });
      } else if (error instanceof ApiError && needsApproval(error)) {
        setOutcome({ kind: "approval", ref: text, message: error.message });
      } else {
        setOutcome({ kind: "error", error });
      }
    }
    setBusy(false);
  }

  function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    const text = ref.trim();
    if (text === "") {
      setRefError(t("required"));
      return;
    }
    if (parseRef(text) === null) {
      setRefError(t("invalid"));
      return;
    }
    setRefError(null);
    void install(text, false);
  }

  return (
    <Card className="mb-6" aria-labelledby={titleId}>
      <CardHeader title={<span id={titleId}>{t("title")}</span>} description={t("description")} />
      <form onSubmit={submit} noValidate className="flex flex-col gap-3 sm:flex-row sm:items-start" data-testid="install-form">
        <div className="flex-1">
          <Field label={t("label")} hint={t("hint")} error={refError}>
            {(field) => (
              <Input
                {...field}
                data-testid="install-ref"
                name="ref"
                value={ref}
                onChange={(event) => {
                  setRef(event.target.value);
                  if (refError) setRefError(null);
                }}
                placeholder={t("placeholder")}
                autoComplete="off"
                autoCapitalize="none"
                spellCheck={false}
                className="font-mono"
                disabled={readOnly}
                title={readOnlyTitle}
              />
            )}
          </Field>
        </div>
        <MutationButton
          type="submit"
          data-testid="install-submit"
          className="sm:mt-6"
          disabled={busy}
        >
          {busy ? t("installing") : t("submit")}
        </MutationButton>
      </form>
      <div aria-live="polite">
        {outcome.kind === "installed" ? (
          <div data-testid="install-result" className="mt-3 rounded-md border border-ok bg-ok-muted p-3 text-sm">
            <p className="font-medium">
              {t("success", { name: outcome.server.name, version: outcome.server.version })}
            </p>
            <p className="mt-1 text-muted-foreground">
              {t("digest")}:{" "}
              <code className="break-all font-mono text-xs" title={outcome.server.image_digest}>
                {shortDigest(outcome.server.image_digest)}
              </code>
            </p>
          </div>
        ) : null}
        {outcome.kind === "approval" ? (
          <div data-testid="install-approval" className="mt-3 rounded-md border border-warn bg-warn-muted p-3 text-sm">
            <p className="font-medium">{t("approveTitle")}</p>
            <p className="mt-1">{t("approveIntro")}</p>
            <p className="mt-2 whitespace-pre-wrap break-words font-mono text-xs" data-testid="install-approval-message">
              {outcome.message}
            </p>
            <MutationButton
              variant="danger"
              size="sm"
              className="mt-3"
              data-testid="install-approve"
              disabled={busy}
              onClick={() => void install(outcome.ref, true)}
            >
              {busy ? t("installing") : t("approve")}
            </MutationButton>
          </div>
        ) : null}
        {outcome.kind === "notConfigured" ? (
          <div data-testid="not-configured" className="mt-3 rounded-md border bg-muted p-3 text-sm">
            <p className="font-medium">{t("notConfiguredTitle")}</p>
            <p className="mt-1 text-muted-foreground">{t("notConfigured")}</p>
          </div>
        ) : null}
        {outcome.kind === "error" ? (
          <div className="mt-3">
            <InlineError error={outcome.error} />
          </div>
        ) : null}
      </div>
    </Card>
  );
}
