"use client";

import { useTranslations } from "next-intl";

import { Badge, type BadgeTone } from "@/components/ui/badge";
import { Button } from "@/components/ui/button";
import { Card, CardHeader } from "@/components/ui/card";
import type { Runtime, RuntimeServer } from "@/lib/api/types";

export function runtimeTone(state: Runtime["state"]): BadgeTone {
  return state === "warm" ? "ok" : state === "starting" ? "info" : "neutral";
}

export function serverTone(state: RuntimeServer["state"]): BadgeTone {
  switch (state) {
    case "ready":
      return "ok";
    case "starting":
      return "info";
    case "failed":
    case "exited":
      return "danger";
    default:
      return "neutral";
  }
}

/** The data-plane runtime as of the last load: cold, starting or warm, and each server's state. */
export function RuntimeCard({
  runtime,
  onRefresh,
  refreshing,
}: {
  runtime: Runtime | undefined;
  onRefresh: () => void;
  refreshing: boolean;
}) {
  const t = useTranslations("profiles.runtime");
  return (
    <Card data-testid="runtime-card">
      <CardHeader
        title={t("title")}
        description={t("description")}
        actions={
          <Button variant="secondary" size="sm" onClick={onRefresh} disabled={refreshing} data-testid="refresh-runtime">
            {refreshing ? t("refreshing") : t("refresh")}
          </Button>
        }
      />
      <div data-testid="runtime-status" data-state={runtime?.state ?? "unknown"} aria-live="polite" aria-busy={refreshing}>
        {runtime === undefined ? (
          <p className="text-sm text-muted-foreground">{t("unknown")}</p>
        ) : (
          <>
            <p className="flex flex-wrap items-center gap-2 text-sm">
              <span className="font-medium">{t("state")}</span>
              <Badge tone={runtimeTone(runtime.state)} data-testid="runtime-state">
                {t(`states.${runtime.state}`)}
              </Badge>
            </p>
            <p className="mt-1 text-sm text-muted-foreground">{t(`explain.${runtime.state}`)}</p>
            {runtime.servers.length > 0 ? (
              <ul className="mt-3 flex flex-col divide-y rounded-md border">
                {runtime.servers.map((server) => (
                  <li key={server.name} data-testid="runtime-server" data-server={server.name} data-state={server.state} className="px-3 py-2">
                    <div className="flex flex-wrap items-center justify-between gap-2">
                      <span className="break-all font-mono text-sm">{server.name}</span>
                      <span className="flex items-center gap-2">
                        <span className="text-xs text-muted-foreground">{t("tools", { count: server.tools })}</span>
                        <Badge tone={serverTone(server.state)}>{t(`serverStates.${server.state}`)}</Badge>
                      </span>
                    </div>
                    {server.error ? (
                      <p className="mt-1 break-words font-mono text-xs text-danger" data-testid="runtime-error">
                        {server.error}
                      </p>
                    ) : null}
                  </li>
                ))}
              </ul>
            ) : null}
          </>
        )}
      </div>
    </Card>
  );
}
