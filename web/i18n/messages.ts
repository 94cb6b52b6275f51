/**
 * Messages are split by page (one JSON file per namespace and language) and merged here, so
 * that each page's strings live beside each other. `tests/unit/messages.test.ts` checks that
 * every language has exactly the keys English has.
 */
import type { Locale } from "./locales";

import enCommon from "@/messages/en/common.json";
import enOverview from "@/messages/en/overview.json";
import enServers from "@/messages/en/servers.json";
import enProfiles from "@/messages/en/profiles.json";
import enCredentials from "@/messages/en/credentials.json";
import enUsers from "@/messages/en/users.json";
import enAudit from "@/messages/en/audit.json";
import enLogin from "@/messages/en/login.json";
import deCommon from "@/messages/de/common.json";
import deOverview from "@/messages/de/overview.json";
import deServers from "@/messages/de/servers.json";
import deProfiles from "@/messages/de/profiles.json";
import deCredentials from "@/messages/de/credentials.json";
import deUsers from "@/messages/de/users.json";
import deAudit from "@/messages/de/audit.json";
import deLogin from "@/messages/de/login.json";

export const MESSAGES = {
  en: {
    common: enCommon,
    overview: enOverview,
    servers: enServers,
    profiles: enProfiles,
    credentials: enCredentials,
    users: enUsers,
    audit: enAudit,
    login: enLogin,
  },
  de: {
    common: deCommon,
    overview: deOverview,
    servers: deServers,
    profiles: deProfiles,
    credentials: deCredentials,
    users: deUsers,
    audit: deAudit,
    login: deLogin,
  },
} satisfies Record<Locale, Record<string, unknown>>;

export type Messages = (typeof MESSAGES)["en"];
