"use client";

import { useTranslations } from "next-intl";
import { useState } from "react";

import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { ConfirmDialog } from "@/components/ui/confirm";
import { InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";

import { TokenDialog } from "./token-dialog";

/** Confirm, rotate, then the new plaintext once; the profile handed on never carries it. */
export function RotateTokenCard({ profile, onRotated }: { profile: Profile; onRotated: (profile: Profile) => void }) {
  const t = useTranslations("profiles.rotate");
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const [token, setToken] = useState<string | null>(null);

  async function rotate() {
    setBusy(true);
    setError(null);
    try {
      const { token: plaintext, ...rotated } = await api.rotateToken(profile.id);
      setConfirming(false);
      setToken(plaintext ?? null);
      onRotated(rotated);
    } catch (cause) {
      setConfirming(false);
      setError(cause);
    }
    setBusy(false);
  }

  return (
    <Card data-testid="rotate-card">
      <CardHeader title={t("title")} description={t("description")} />
      <div className="flex flex-wrap items-center gap-3">
        <MutationButton
          variant="secondary"
          data-testid="rotate-token"
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
        title={t("confirmTitle")}
        description={t("confirmDescription")}
        confirmLabel={busy ? t("rotating") : t("confirm")}
        onConfirm={rotate}
        busy={busy}
      />
      <TokenDialog token={token} slug={profile.slug} title={t("newTokenTitle")} onClose={() => setToken(null)} />
    </Card>
  );
}
