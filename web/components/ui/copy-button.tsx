"use client";

import { useTranslations } from "next-intl";
import { useEffect, useState } from "react";

import { Button, type ButtonProps } from "./button";

const RESET_MS = 2000;

/** Selects the text of `target` so the user can copy it by hand (the clipboard was refused). */
function selectText(targetId: string | undefined): boolean {
  if (!targetId) return false;
  const target = document.getElementById(targetId);
  if (!target) return false;
  if (target instanceof HTMLInputElement || target instanceof HTMLTextAreaElement) {
    target.focus();
    target.select();
  } else {
    const selection = window.getSelection();
    if (!selection) return false;
    selection.selectAllChildren(target);
  }
  try {
    // Deprecated but still the only fallback without the async clipboard (plain http).
    return document.execCommand("copy");
  } catch {
    return false;
  }
}

/**
 * Copies `value` with the async clipboard; where that is unavailable (an insecure origin)
 * or refused, selects the text of the element `targetId` instead, ready for Ctrl+C.
 * Says "Copied" for two seconds, announced to screen readers.
 */
export function CopyButton({
  value,
  targetId,
  label,
  variant = "secondary",
  size = "sm",
  ...props
}: Omit<ButtonProps, "onClick" | "value" | "children"> & { value: string; targetId?: string; label?: string }) {
  const t = useTranslations("common");
  const [copied, setCopied] = useState(false);

  useEffect(() => {
    if (!copied) return;
    const timer = window.setTimeout(() => setCopied(false), RESET_MS);
    return () => window.clearTimeout(timer);
  }, [copied]);

  async function copy() {
    let ok = false;
    try {
      if (navigator.clipboard && window.isSecureContext) {
        await navigator.clipboard.writeText(value);
        ok = true;
      }
    } catch {
      ok = false;
    }
    if (!ok) ok = selectText(targetId);
    setCopied(ok);
  }

  return (
    <Button variant={variant} size={size} onClick={copy} {...props}>
      <span aria-live="polite">{copied ? t("copied") : (label ?? t("copy"))}</span>
    </Button>
  );
}
