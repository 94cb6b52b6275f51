"use client";

import { useTranslations } from "next-intl";
import { useState } from "react";

import { CredentialForm } from "@/components/credentials/credential-form";
import { CredentialList } from "@/components/credentials/credential-list";
import { useSession } from "@/components/session";
import { Card, CardHeader } from "@/components/ui/card";
import { ConfirmDialog } from "@/components/ui/confirm";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState, InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { CredentialMetadata } from "@/lib/api/types";
import { useResource } from "@/lib/use-resource";
import { EMPTY_CREDENTIAL_FORM, type CredentialForm as FormValues } from "@/lib/validation";

/** What the form starts from: empty, or a credential's metadata for an edit (never a secret). */
interface Draft {
  key: number;
  initial: FormValues;
  editing: boolean;
}

function fromMetadata(credential: CredentialMetadata): FormValues {
  return {
    server: credential.server,
    secret: "",
    header: credential.inject_header ?? "",
    format: credential.inject_format ?? "",
    placeholder: credential.placeholder ?? "",
    hosts: credential.allowed_hosts.join("\n"),
  };
}

export default function CredentialsPage() {
  const t = useTranslations("credentials");
  const { me, readOnly } = useSession();
  const credentials = useResource((signal) => api.credentials(signal), [me.user.id]);
  // Only for the server-name suggestions and a "not installed" badge: failing is harmless.
  const servers = useResource((signal) => api.servers(signal), [me.user.id]);
  const [draft, setDraft] = useState<Draft>({ key: 0, initial: EMPTY_CREDENTIAL_FORM, editing: false });
  const [saved, setSaved] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [deleteError, setDeleteError] = useState<unknown>(null);
  const [deleted, setDeleted] = useState<string | null>(null);

  const serverNames = (servers.data ?? []).map((server) => server.name);
  const installed = servers.data ? new Set(serverNames) : null;

  function reset() {
    // A new key remounts the form: nothing typed (least of all a secret) survives.
    setDraft((old) => ({ key: old.key + 1, initial: EMPTY_CREDENTIAL_FORM, editing: false }));
  }

  function onSaved(server: string) {
    reset();
    setSaved(server);
    setDeleted(null);
    credentials.reload();
  }

  function edit(credential: CredentialMetadata) {
    setSaved(null);
    setDeleted(null);
    setDraft((old) => ({ key: old.key + 1, initial: fromMetadata(credential), editing: true }));
  }

  async function remove() {
    if (deleting === null) return;
    const server = deleting;
    setBusy(true);
    setDeleteError(null);
    try {
      await api.deleteCredential(server);
      setDeleted(server);
      setSaved(null);
      if (draft.editing && draft.initial.server === server) reset();
      credentials.reload();
    } catch (cause) {
      setDeleteError(cause);
    }
    setDeleting(null);
    setBusy(false);
  }

  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      <div className="flex flex-col gap-6">
        <CredentialForm
          key={draft.key}
          initial={draft.initial}
          editing={draft.editing}
          serverNames={serverNames}
          onSaved={onSaved}
          onCancel={reset}
        />
        <div aria-live="polite">
          {saved ? (
            <p className="text-sm text-ok" data-testid="credential-saved">
              {t("saved", { server: saved })}
            </p>
          ) : deleted ? (
            <p className="text-sm text-ok" data-testid="credential-deleted">
              {t("deleted", { server: deleted })}
            </p>
          ) : null}
        </div>
        <Card>
          <CardHeader title={t("list.title")} description={t("list.description")} />
          <InlineError error={deleteError} />
          {credentials.error ? (
            <ErrorState error={credentials.error} onRetry={credentials.reload} />
          ) : credentials.data === undefined ? (
            <ListSkeleton rows={3} label={t("list.loading")} />
          ) : credentials.data.length === 0 ? (
            <EmptyState title={t("list.empty")}>{t("list.emptyHint")}</EmptyState>
          ) : (
            <CredentialList
              credentials={credentials.data}
              installed={installed}
              onEdit={edit}
              onDelete={(server) => {
                setDeleteError(null);
                setDeleting(server);
              }}
            />
          )}
        </Card>
      </div>
      <ConfirmDialog
        open={deleting !== null && !readOnly}
        onOpenChange={(open) => {
          if (!open && !busy) setDeleting(null);
        }}
        title={t("confirmDelete.title", { server: deleting ?? "" })}
        description={t("confirmDelete.description")}
        confirmLabel={busy ? t("confirmDelete.deleting") : t("confirmDelete.confirm")}
        onConfirm={remove}
        busy={busy}
      />
    </>
  );
}
