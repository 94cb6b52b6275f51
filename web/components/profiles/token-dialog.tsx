"use client";

import { useTranslations } from "next-intl";
import { useId } from "react";

import { Button } from "@/components/ui/button";
import { CopyButton } from "@/components/ui/copy-button";
import { Dialog } from "@/components/ui/dialog";

/**
 * A profile token in plaintext, the one time the gateway hands it out (create or rotate).
 * Open while `token` is set; closing calls `onClose`, whose caller drops the token.
 */
export function TokenDialog({
  token,
  slug,
  onClose,
  title,
}: {
  token: string | null;
  slug: string;
  onClose: () => void;
  title: string;
}) {
  const t = useTranslations("profiles.token");
  const id = useId();
  const codeId = `${id}-token`;
  return (
    <Dialog
      open={token !== null}
      onOpenChange={(open) => {
        if (!open) onClose();
      }}
      title={title}
      description={t("description", { slug })}
      footer={
        <Button onClick={onClose} data-testid="token-done">
          {t("done")}
        </Button>
      }
    >
      <div className="flex flex-col gap-3">
        <p role="note" className="rounded-md border border-warn bg-warn-muted p-3 text-sm font-medium">
          {t("onceWarning")}
        </p>
        <pre className="overflow-x-auto rounded-md border bg-muted p-3 text-sm" aria-label={t("label")}>
          <code id={codeId} data-testid="token-value" className="select-all break-all whitespace-pre-wrap font-mono">
            {token ?? ""}
          </code>
        </pre>
        <div>
          <CopyButton value={token ?? ""} targetId={codeId} data-testid="copy-token" label={t("copy")} />
        </div>
      </div>
    </Dialog>
  );
}
