"use client";

import { useTranslations } from "next-intl";
import { useState, type FormEvent } from "react";

import { useSession } from "@/components/session";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { Field, Input } from "@/components/ui/input";
import { InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";
import { validateProfileName } from "@/lib/validation";

/** The display name (PATCH); the slug, and so the endpoint, never changes. */
export function RenameCard({ profile, onRenamed }: { profile: Profile; onRenamed: (profile: Profile) => void }) {
  const t = useTranslations("profiles.rename");
  const tp = useTranslations("profiles");
  const tc = useTranslations("common");
  const { readOnly } = useSession();
  // null: not edited, so the field shows the profile's current name.
  const [draft, setDraft] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [done, setDone] = useState(false);
  const [error, setError] = useState<unknown>(null);

  const value = draft ?? profile.name;
  const problem = draft === null ? null : validateProfileName(value);
  const changed = draft !== null && value.trim() !== profile.name;

  async function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    if (readOnly || busy || !changed || problem) return;
    setBusy(true);
    setError(null);
    try {
      const renamed = await api.renameProfile(profile.id, value.trim());
      setDraft(null);
      setDone(true);
      onRenamed(renamed);
    } catch (cause) {
      setError(cause);
    }
    setBusy(false);
  }

  return (
    <Card data-testid="rename-card">
      <CardHeader title={t("title")} description={t("description")} />
      <form onSubmit={submit} noValidate className="flex flex-col gap-3 sm:flex-row sm:items-start">
        <div className="min-w-0 flex-1">
          <Field label={t("label")} error={problem ? tp(problem) : null}>
            {(props) => (
              <Input
                {...props}
                data-testid="rename-input"
                value={value}
                autoComplete="off"
                maxLength={512}
                onChange={(event) => {
                  setDraft(event.target.value);
                  setDone(false);
                  setError(null);
                }}
              />
            )}
          </Field>
        </div>
        <MutationButton
          type="submit"
          data-testid="rename"
          className="sm:mt-6"
          disabled={busy || !changed || problem !== null}
        >
          {busy ? tc("saving") : t("submit")}
        </MutationButton>
      </form>
      <div className="mt-2" aria-live="polite">
        {done ? (
          <p className="text-sm text-ok" data-testid="renamed">
            {t("done")}
          </p>
        ) : null}
      </div>
      <InlineError error={error} />
    </Card>
  );
}
