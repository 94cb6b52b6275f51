"use client";

import { useTranslations } from "next-intl";
import type { ReactNode } from "react";

import { ApiError } from "@/lib/api/client";

import { Button } from "./button";

/** What went wrong, in words, with a retry button. */
export function ErrorState({ error, onRetry }: { error: unknown; onRetry?: () => void }) {
  const t = useTranslations("common");
  const message =
    error instanceof ApiError
      ? error.fromGateway
        ? `${error.message} (${error.code})`
        : t("gatewayUnavailable")
      : t("unexpectedError");
  return (
    <div role="alert" data-testid="error-state" className="rounded-lg border border-danger bg-danger-muted p-4 text-sm">
      <p className="font-medium">{t("errorTitle")}</p>
      <p className="mt-1 break-words">{message}</p>
      {onRetry ? (
        <Button variant="secondary" size="sm" className="mt-3" onClick={onRetry}>
          {t("retry")}
        </Button>
      ) : null}
    </div>
  );
}

export function EmptyState({ title, children }: { title: ReactNode; children?: ReactNode }) {
  return (
    <div data-testid="empty-state" className="rounded-lg border border-dashed p-6 text-center">
      <p className="font-medium">{title}</p>
      {children ? <div className="mt-1 text-sm text-muted-foreground">{children}</div> : null}
    </div>
  );
}

/** An inline error under a form or action (e.g. the gateway refused a change). */
export function InlineError({ error }: { error: unknown }) {
  const t = useTranslations("common");
  if (!error) return null;
  const message =
    error instanceof ApiError ? (error.fromGateway ? error.message : t("gatewayUnavailable")) : t("unexpectedError");
  return (
    <p role="alert" className="text-sm text-danger">
      {message}
    </p>
  );
}
