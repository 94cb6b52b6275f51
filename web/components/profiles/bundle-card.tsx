"use client";

import Link from "next/link";
import { useTranslations } from "next-intl";
import { useId, useState } from "react";

import { useSession } from "@/components/session";
import { MutationButton } from "@/components/ui/mutation-button";
import { Card, CardHeader } from "@/components/ui/card";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState, InlineError } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";
import { useResource } from "@/lib/use-resource";

function sameSet(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  const set = new Set(a);
  return b.every((name) => set.has(name));
}

/**
 * One checkbox per installed server; Save sends every checked name in one replace-all PUT.
 * The selection is the profile's until the first change (so a reload never loses edits).
 */
export function BundleCard({ profile, onSaved }: { profile: Profile; onSaved: (profile: Profile) => void }) {
  const t = useTranslations("profiles.bundle");
  const tc = useTranslations("common");
  const { readOnly } = useSession();
  const servers = useResource((signal) => api.servers(signal));
  const [selected, setSelected] = useState<string[] | null>(null);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const id = useId();

  const installed = (servers.data ?? []).map((server) => server.name);
  const installedSet = new Set(installed);
  const current = new Set(selected ?? profile.servers);
  const checked = installed.filter((name) => current.has(name));
  const inProfile = profile.servers.filter((name) => installedSet.has(name));
  const missing = profile.servers.filter((name) => !installedSet.has(name));
  const changed = selected !== null && !sameSet(checked, inProfile);

  function toggle(name: string, on: boolean) {
    setSelected((previous) => {
      const base = (previous ?? profile.servers).filter((other) => other !== name);
      return on ? [...base, name] : base;
    });
    setSaved(false);
    setError(null);
  }

  async function save() {
    if (readOnly || !changed) return;
    setBusy(true);
    setError(null);
    setSaved(false);
    try {
      const updated = await api.setProfileServers(profile.id, checked);
      setSelected(null);
      setSaved(true);
      onSaved(updated);
    } catch (cause) {
      setError(cause);
    }
    setBusy(false);
  }

  let body;
  if (servers.error) {
    body = <ErrorState error={servers.error} onRetry={servers.reload} />;
  } else if (servers.data === undefined) {
    body = <ListSkeleton rows={3} label={t("loading")} />;
  } else if (installed.length === 0) {
    body = (
      <EmptyState title={t("noServers")}>
        {t("noServersHint")}{" "}
        <Link href="/servers" className="text-primary underline-offset-4 hover:underline">
          {t("serversLink")}
        </Link>
      </EmptyState>
    );
  } else {
    body = (
      <fieldset disabled={readOnly || busy} className="min-w-0" data-testid="bundle">
        <legend className="mb-2 text-sm font-medium">{t("legend")}</legend>
        <ul className="grid gap-1 sm:grid-cols-2">
          {installed.map((name) => {
            const inputId = `${id}-${name}`;
            return (
              <li key={name}>
                <label
                  htmlFor={inputId}
                  className="flex cursor-pointer items-center gap-3 rounded-md border px-3 py-2 hover:bg-accent has-[:focus-visible]:ring-2 has-[:focus-visible]:ring-ring"
                >
                  <input
                    id={inputId}
                    type="checkbox"
                    name="servers"
                    value={name}
                    data-testid="bundle-server"
                    data-server={name}
                    checked={current.has(name)}
                    onChange={(event) => toggle(name, event.target.checked)}
                    className="size-4 accent-[var(--primary)]"
                  />
                  <span className="break-all font-mono text-sm">{name}</span>
                </label>
              </li>
            );
          })}
        </ul>
      </fieldset>
    );
  }

  return (
    <Card data-testid="bundle-card">
      <CardHeader title={t("title")} description={t("description")} />
      {body}
      {missing.length > 0 ? (
        <p className="mt-3 text-sm text-muted-foreground" data-testid="bundle-missing">
          {t("missing", { names: missing.join(", ") })}
        </p>
      ) : null}
      <div className="mt-4 flex flex-wrap items-center gap-3">
        <MutationButton
          data-testid="save-bundle"
          onClick={save}
          disabled={busy || !changed}
        >
          {busy ? tc("saving") : t("save")}
        </MutationButton>
        <span className="text-sm text-muted-foreground" aria-live="polite">
          {changed ? t("unsaved") : saved ? <span className="text-ok" data-testid="bundle-saved">{t("saved")}</span> : null}
        </span>
      </div>
      {error ? (
        <div className="mt-2" data-testid="bundle-failed">
          <p className="text-sm font-medium text-danger">{t("failed")}</p>
          <InlineError error={error} />
        </div>
      ) : null}
    </Card>
  );
}
