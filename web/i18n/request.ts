import { cookies } from "next/headers";
import { getRequestConfig } from "next-intl/server";

import { LOCALE_COOKIE, toLocale } from "./locales";
import { MESSAGES } from "./messages";

// Without i18n routing: the locale comes from the language cookie only.
export default getRequestConfig(async () => {
  const locale = toLocale((await cookies()).get(LOCALE_COOKIE)?.value);
  return { locale, messages: MESSAGES[locale] };
});
