import { describe, expect, it } from "vitest";

import { LOCALES, toLocale } from "@/i18n/locales";
import { MESSAGES } from "@/i18n/messages";

function keys(value: unknown, prefix = ""): string[] {
  if (typeof value !== "object" || value === null) return [prefix];
  return Object.entries(value).flatMap(([key, inner]) => keys(inner, prefix ? `${prefix}.${key}` : key));
}

/** ICU arguments: `{name}` or `{count, plural, ...}` (not the words inside plural branches). */
function placeholders(text: string): string[] {
  return [...text.matchAll(/\{\s*(\w+)\s*[,}]/g)].map((match) => match[1] ?? "").sort();
}

function lookup(messages: unknown, key: string): unknown {
  return key.split(".").reduce<unknown>((node, part) => (node as Record<string, unknown>)[part], messages);
}

describe("translations", () => {
  const english = keys(MESSAGES.en).sort();

  it.each(LOCALES)("%s has exactly the English keys", (locale) => {
    expect(keys(MESSAGES[locale]).sort()).toEqual(english);
  });

  it.each(LOCALES)("%s has no empty strings and the same placeholders as English", (locale) => {
    for (const key of english) {
      const text = lookup(MESSAGES[locale], key);
      expect(typeof text, key).toBe("string");
      expect((text as string).trim(), key).not.toBe("");
      expect(placeholders(text as string), key).toEqual(placeholders(lookup(MESSAGES.en, key) as string));
    }
  });

  it("falls back to English for an unknown cookie value", () => {
    expect(toLocale("de")).toBe("de");
    expect(toLocale("fr")).toBe("en");
    expect(toLocale(undefined)).toBe("en");
    expect(toLocale("__proto__")).toBe("en");
  });
});
