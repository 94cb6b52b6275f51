/** Languages of the dashboard. The choice lives in a cookie; there is no locale routing. */
export const LOCALES = ["en", "de"] as const;
export type Locale = (typeof LOCALES)[number];
export const DEFAULT_LOCALE: Locale = "en";
export const LOCALE_COOKIE = "svc_locale";
export const LOCALE_NAMES: Record<Locale, string> = { en: "English", de: "Deutsch" };

export function toLocale(value: string | undefined | null): Locale {
  return (LOCALES as readonly string[]).includes(value ?? "") ? (value as Locale) : DEFAULT_LOCALE;
}
