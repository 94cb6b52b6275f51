"use client";

import { useLocale, useTranslations } from "next-intl";
import { useRouter } from "next/navigation";
import { useId, useTransition } from "react";

import { LOCALE_COOKIE, LOCALE_NAMES, LOCALES, toLocale } from "@/i18n/locales";

/** Writes the language cookie and re-renders; the URL never changes (no locale routing). */
export function LanguageSwitcher() {
  const t = useTranslations("common.language");
  const locale = useLocale();
  const router = useRouter();
  const [pending, startTransition] = useTransition();
  const id = useId();
  return (
    <div className="flex items-center gap-1">
      <label htmlFor={id} className="sr-only">
        {t("label")}
      </label>
      <select
        id={id}
        data-testid="language-switcher"
        value={locale}
        disabled={pending}
        onChange={(event) => {
          const next = toLocale(event.target.value);
          document.cookie = `${LOCALE_COOKIE}=${next}; path=/; max-age=31536000; samesite=lax`;
          startTransition(() => router.refresh());
        }}
        className="h-8 rounded-md border bg-background px-2 text-xs"
      >
        {LOCALES.map((value) => (
          <option key={value} value={value}>
            {LOCALE_NAMES[value]}
          </option>
        ))}
      </select>
    </div>
  );
}
