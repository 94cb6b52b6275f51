"use client";

import { useFormatter, useTranslations } from "next-intl";

import { Badge } from "@/components/ui/badge";
import { MutationButton } from "@/components/ui/mutation-button";
import type { CredentialMetadata } from "@/lib/api/types";

function Value({ value, fallback }: { value: string | null | undefined; fallback: string }) {
  if (!value) return <span className="text-muted-foreground">{fallback}</span>;
  return <span className="break-all font-mono text-xs">{value}</span>;
}

/** Metadata only: the gateway never returns a secret or anything derived from it. */
export function CredentialList({
  credentials,
  installed,
  onEdit,
  onDelete,
}: {
  credentials: readonly CredentialMetadata[];
  installed: ReadonlySet<string> | null;
  onEdit: (credential: CredentialMetadata) => void;
  onDelete: (server: string) => void;
}) {
  const t = useTranslations("credentials.list");
  const tc = useTranslations("common");
  const format = useFormatter();
  return (
    <ul aria-label={t("title")} data-testid="credential-list" className="flex flex-col divide-y">
      {credentials.map((credential) => {
        const when = credential.updated_at ?? credential.created_at;
        return (
          <li key={credential.server} data-testid="credential-row" data-server={credential.server} className="py-3">
            <div className="flex flex-wrap items-start justify-between gap-2">
              <div className="flex min-w-0 flex-wrap items-center gap-2">
                <h3 className="break-all font-mono text-sm font-semibold">{credential.server}</h3>
                {installed !== null && !installed.has(credential.server) ? (
                  <Badge tone="warn">{t("notInstalled")}</Badge>
                ) : null}
              </div>
              <div className="flex gap-2">
                <MutationButton
                  variant="secondary"
                  size="sm"
                  data-testid="edit-credential"
                  onClick={() => onEdit(credential)}
                  aria-label={t("editLabel", { server: credential.server })}
                >
                  {t("edit")}
                </MutationButton>
                <MutationButton
                  variant="danger"
                  size="sm"
                  data-testid="delete-credential"
                  onClick={() => onDelete(credential.server)}
                  aria-label={t("deleteLabel", { server: credential.server })}
                >
                  {tc("delete")}
                </MutationButton>
              </div>
            </div>
            <dl className="mt-2 grid grid-cols-1 gap-x-4 gap-y-1 text-sm sm:grid-cols-[max-content_1fr]">
              <dt className="text-muted-foreground">{t("header")}</dt>
              <dd data-field="inject_header">
                <Value value={credential.inject_header} fallback={t("defaultHeader")} />
              </dd>
              <dt className="text-muted-foreground">{t("format")}</dt>
              <dd data-field="inject_format">
                <Value value={credential.inject_format} fallback={t("defaultFormat")} />
              </dd>
              <dt className="text-muted-foreground">{t("placeholder")}</dt>
              <dd data-field="placeholder">
                <Value value={credential.placeholder} fallback={t("none")} />
              </dd>
              <dt className="text-muted-foreground">{t("hosts")}</dt>
              <dd data-field="allowed_hosts">
                {credential.allowed_hosts.length === 0 ? (
                  <span className="text-muted-foreground">{t("noHosts")}</span>
                ) : (
                  <ul className="flex flex-wrap gap-1">
                    {credential.allowed_hosts.map((host) => (
                      <li key={host}>
                        <Badge tone="neutral" className="font-mono">
                          {host}
                        </Badge>
                      </li>
                    ))}
                  </ul>
                )}
              </dd>
              {when ? (
                <>
                  <dt className="text-muted-foreground">{t("updated")}</dt>
                  <dd>
                    <time dateTime={when}>{format.dateTime(new Date(when), { dateStyle: "medium", timeStyle: "short" })}</time>
                  </dd>
                </>
              ) : null}
            </dl>
          </li>
        );
      })}
    </ul>
  );
}
