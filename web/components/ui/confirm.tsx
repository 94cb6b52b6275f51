"use client";

import { AlertDialog as A } from "radix-ui";
import { useTranslations } from "next-intl";
import type { ReactNode } from "react";

import { cn } from "@/lib/cn";

import { useReturnFocus } from "./return-focus";

/** A confirmation for destructive actions (Radix AlertDialog: focus starts on Cancel). */
export function ConfirmDialog({
  open,
  onOpenChange,
  title,
  description,
  confirmLabel,
  onConfirm,
  busy = false,
}: {
  open: boolean;
  onOpenChange: (open: boolean) => void;
  title: ReactNode;
  description: ReactNode;
  confirmLabel: ReactNode;
  onConfirm: () => void;
  busy?: boolean;
}) {
  const t = useTranslations("common");
  const returnFocus = useReturnFocus();
  return (
    <A.Root open={open} onOpenChange={onOpenChange}>
      <A.Portal>
        <A.Overlay className="fixed inset-0 z-40 bg-black/50" />
        <A.Content
          {...returnFocus}
          className={cn(
            "fixed left-1/2 top-1/2 z-50 w-[calc(100vw-2rem)] max-w-md -translate-x-1/2 -translate-y-1/2",
            "rounded-lg border bg-card p-5 text-foreground shadow-lg focus:outline-none",
          )}
        >
          <A.Title className="text-lg font-semibold">{title}</A.Title>
          <A.Description className="mt-2 text-sm text-muted-foreground">{description}</A.Description>
          <div className="mt-5 flex flex-wrap justify-end gap-2">
            <A.Cancel className="inline-flex h-10 items-center rounded-md border bg-card px-4 text-sm font-medium hover:bg-accent focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring">
              {t("cancel")}
            </A.Cancel>
            <button
              type="button"
              data-testid="confirm"
              disabled={busy}
              onClick={onConfirm}
              className="inline-flex h-10 items-center rounded-md bg-danger px-4 text-sm font-medium text-danger-foreground hover:opacity-90 focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring disabled:opacity-50"
            >
              {confirmLabel}
            </button>
          </div>
        </A.Content>
      </A.Portal>
    </A.Root>
  );
}
