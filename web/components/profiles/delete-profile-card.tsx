"use client";

import { useRouter } from "next/navigation";
import { useTranslations } from "next-intl";
import { useState } from "react";

import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { ConfirmDialog } from "@/components/ui/confirm";
import { InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";

/** Deletes the profile (its endpoint and token stop working) and returns to the list. */
export function DeleteProfileCard({ profile }: { profile: Profile }) {
  const t = useTranslations("profiles.delete");
  const tc = useTranslations("common");
  const router = useRouter();
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);

  async function remove() {
    setBusy(true);
    setError(null);
    try {
      await api.deleteProfile(profile.id);
      setConfirming(false);
      router.push("/profiles");
    } catch (cause) {
      setConfirming(false);
      setError(cause);
      setBusy(false);
    }
  }

  return (
    <Card data-testid="delete-card" className="border-danger">
      <CardHeader title={t("title")} description={t("description")} />
      <div className="flex flex-wrap items-center gap-3">
        <MutationButton
          variant="danger"
          data-testid="delete-profile"
          onClick={() => setConfirming(true)}
          disabled={busy}
        >
          {t("button")}
        </MutationButton>
        <InlineError error={error} />
      </div>
      <ConfirmDialog
        open={confirming}
        onOpenChange={(open) => {
          if (!busy) setConfirming(open);
        }}
        title={t("confirmTitle", { name: profile.name })}
        description={t("confirmDescription", { slug: profile.slug })}
        confirmLabel={busy ? t("deleting") : tc("delete")}
        onConfirm={remove}
        busy={busy}
      />
    </Card>
  );
}
