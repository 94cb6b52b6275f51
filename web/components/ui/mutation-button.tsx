"use client";

import { useTranslations } from "next-intl";

import { useSession } from "@/components/session";

import { Button, type ButtonProps } from "./button";

/**
 * A button that changes something. While viewing as another user it is disabled, with a
 * title that says why: the one place that enforces "every mutating control disabled".
 */
export function MutationButton({ disabled, title, ...props }: ButtonProps) {
  const { readOnly } = useSession();
  const t = useTranslations("common.viewAs");
  return <Button {...props} disabled={readOnly || disabled} title={readOnly ? t("readOnlyHint") : title} />;
}
