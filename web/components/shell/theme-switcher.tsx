"use client";

import { useTranslations } from "next-intl";
import { useTheme } from "next-themes";
import { useSyncExternalStore } from "react";

import { cn } from "@/lib/cn";

const THEMES = ["light", "dark", "system"] as const;
const subscribeNothing = () => () => {};

/** Light / dark / system as a labelled radio group (arrow keys move, as native radios do). */
export function ThemeSwitcher() {
  const t = useTranslations("common.theme");
  const { theme, setTheme } = useTheme();
  // The stored theme is known only in the browser: render no selection on the server.
  const mounted = useSyncExternalStore(subscribeNothing, () => true, () => false);
  const current = mounted ? (theme ?? "system") : undefined;
  return (
    <fieldset className="flex items-center rounded-md border p-0.5" data-testid="theme-switcher">
      <legend className="sr-only">{t("label")}</legend>
      {THEMES.map((value) => (
        <label
          key={value}
          className={cn(
            "cursor-pointer rounded px-2 py-1 text-xs has-[:focus-visible]:ring-2 has-[:focus-visible]:ring-ring",
            current === value ? "bg-primary text-primary-foreground" : "hover:bg-accent",
          )}
        >
          <input
            type="radio"
            name="theme"
            value={value}
            className="sr-only"
            checked={current === value}
            onChange={() => setTheme(value)}
          />
          {t(value)}
        </label>
      ))}
    </fieldset>
  );
}
