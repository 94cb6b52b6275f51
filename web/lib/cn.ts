/** Joins class names, skipping falsy ones (the few components here need no merging). */
export function cn(...parts: Array<string | false | null | undefined>): string {
  return parts.filter(Boolean).join(" ");
}
