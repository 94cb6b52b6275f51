"use client";

import { useTranslations } from "next-intl";
import { useState, type FormEvent } from "react";

import { useSession } from "@/components/session";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { Field, Input } from "@/components/ui/input";
import { InlineError } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";
import { slugFromName, validateProfileName, validateSlug } from "@/lib/validation";

/**
 * Name + slug. The slug follows the name until it is edited (clearing it follows again).
 * Problems show under the fields once a submit was tried; a taken slug (409) under the slug.
 */
export function CreateProfileForm({ onCreated }: { onCreated: (profile: Profile) => void }) {
  const t = useTranslations("profiles");
  const { readOnly } = useSession();
  const [name, setName] = useState("");
  const [slug, setSlug] = useState("");
  const [slugEdited, setSlugEdited] = useState(false);
  const [submitted, setSubmitted] = useState(false);
  const [busy, setBusy] = useState(false);
  const [takenSlug, setTakenSlug] = useState<string | null>(null);
  const [error, setError] = useState<unknown>(null);

  const nameError = validateProfileName(name);
  const slugError = validateSlug(slug);
  const shownNameError = submitted && nameError ? t(nameError) : null;
  const shownSlugError =
    takenSlug !== null && takenSlug === slug
      ? t("validation.slugTaken")
      : submitted && slugError
        ? t(slugError)
        : null;

  function changeName(value: string) {
    setName(value);
    setError(null);
    if (!slugEdited) setSlug(slugFromName(value));
  }

  function changeSlug(value: string) {
    setSlug(value);
    setError(null);
    setSlugEdited(value !== "");
  }

  async function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    setSubmitted(true);
    if (readOnly || busy || nameError || slugError || takenSlug === slug) return;
    setBusy(true);
    setError(null);
    try {
      const created = await api.createProfile(name.trim(), slug);
      setName("");
      setSlug("");
      setSlugEdited(false);
      setSubmitted(false);
      setTakenSlug(null);
      onCreated(created);
    } catch (cause) {
      if (cause instanceof ApiError && cause.code === "conflict") setTakenSlug(slug);
      else setError(cause);
    }
    setBusy(false);
  }

  return (
    <Card>
      <CardHeader title={t("create.title")} description={t("create.description")} />
      <form onSubmit={submit} noValidate className="flex flex-col gap-4" aria-label={t("create.title")}>
        <div className="grid gap-4 sm:grid-cols-2">
          <Field label={t("create.name")} error={shownNameError} hint={t("create.nameHint")}>
            {(props) => (
              <Input
                {...props}
                data-testid="profile-name"
                value={name}
                onChange={(event) => changeName(event.target.value)}
                autoComplete="off"
                maxLength={512}
              />
            )}
          </Field>
          <Field label={t("create.slug")} error={shownSlugError} hint={t("create.slugHint")}>
            {(props) => (
              <Input
                {...props}
                data-testid="profile-slug"
                value={slug}
                onChange={(event) => changeSlug(event.target.value)}
                autoComplete="off"
                autoCapitalize="none"
                spellCheck={false}
                className="font-mono"
              />
            )}
          </Field>
        </div>
        <InlineError error={error} />
        <div>
          <MutationButton
            type="submit"
            data-testid="create-profile"
            disabled={busy}
          >
            {busy ? t("create.creating") : t("create.submit")}
          </MutationButton>
        </div>
      </form>
    </Card>
  );
}
