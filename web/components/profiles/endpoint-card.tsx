"use client";

import { useTranslations } from "next-intl";
import { useId, useSyncExternalStore } from "react";

import { Card, CardHeader } from "@/components/ui/card";
import { CopyButton } from "@/components/ui/copy-button";
import type { Profile } from "@/lib/api/types";

/** Never a real token: the page only has one right after a rotation, in its dialog. */
export const TOKEN_PLACEHOLDER = "<your profile token>";

const noSubscription = () => () => {};

/** The browser's origin (the dashboard rewrites `/mcp/*` to the gateway); empty on the server. */
function useOrigin(): string {
  return useSyncExternalStore(
    noSubscription,
    () => window.location.origin,
    () => "",
  );
}

/** An MCP client's configuration for this endpoint, e.g. for Claude Code or Cursor. */
export function clientConfig(slug: string, url: string): string {
  return JSON.stringify(
    {
      mcpServers: {
        [slug]: { type: "http", url, headers: { Authorization: `Bearer ${TOKEN_PLACEHOLDER}` } },
      },
    },
    null,
    2,
  );
}

export function EndpointCard({ profile }: { profile: Profile }) {
  const t = useTranslations("profiles.endpoint");
  const origin = useOrigin();
  const id = useId();
  const url = `${origin}${profile.endpoint}`;
  const config = clientConfig(profile.slug, url);
  return (
    <Card data-testid="endpoint-card">
      <CardHeader title={t("title")} description={t("description")} />
      <div className="flex flex-col gap-4">
        <div className="flex flex-col gap-2 sm:flex-row sm:items-center">
          <code
            id={`${id}-url`}
            data-testid="endpoint-url"
            className="min-w-0 flex-1 break-all rounded-md border bg-muted px-3 py-2 font-mono text-sm"
          >
            {url}
          </code>
          <CopyButton value={url} targetId={`${id}-url`} data-testid="copy-endpoint" label={t("copyUrl")} />
        </div>
        <div className="flex flex-col gap-2">
          <div className="flex flex-wrap items-center justify-between gap-2">
            <h3 className="text-sm font-medium" id={`${id}-config-title`}>
              {t("configTitle")}
            </h3>
            <CopyButton value={config} targetId={`${id}-config`} data-testid="copy-client-config" label={t("copyConfig")} />
          </div>
          <pre
            id={`${id}-config`}
            data-testid="client-config"
            aria-labelledby={`${id}-config-title`}
            tabIndex={0}
            className="overflow-x-auto rounded-md border bg-muted p-3 font-mono text-xs focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring"
          >
            {config}
          </pre>
          <p className="text-xs text-muted-foreground">{t("configHint")}</p>
        </div>
      </div>
    </Card>
  );
}
