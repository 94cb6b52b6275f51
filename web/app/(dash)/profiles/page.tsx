"use client";

import Link from "next/link";
import { useTranslations } from "next-intl";
import { useState } from "react";

import { CreateProfileForm } from "@/components/profiles/create-profile-form";
import { TokenDialog } from "@/components/profiles/token-dialog";
import { useSession } from "@/components/session";
import { Badge } from "@/components/ui/badge";
import { Card, CardHeader } from "@/components/ui/card";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState } from "@/components/ui/states";
import { api } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";
import { useResource } from "@/lib/use-resource";

function ProfileRow({ profile }: { profile: Profile }) {
  const t = useTranslations("profiles.list");
  return (
    <li data-testid="profile-row" data-profile-id={profile.id} data-slug={profile.slug} className="relative border-t first:border-t-0">
      <div className="flex flex-col gap-1 px-1 py-3 sm:flex-row sm:items-center sm:justify-between sm:gap-4">
        <div className="min-w-0">
          <Link
            href={`/profiles/${profile.id}`}
            className="font-medium text-primary underline-offset-4 hover:underline focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring"
          >
            {profile.name}
          </Link>
          <p className="mt-0.5 text-xs text-muted-foreground">
            <span className="sr-only">{t("slug")}: </span>
            <span className="font-mono">{profile.slug}</span>
          </p>
        </div>
        <div className="flex min-w-0 flex-wrap items-center gap-2 sm:justify-end">
          <code className="break-all text-xs text-muted-foreground" title={t("endpoint")}>
            <span className="sr-only">{t("endpoint")}: </span>
            {profile.endpoint}
          </code>
          <Badge tone={profile.servers.length > 0 ? "info" : "neutral"} data-testid="profile-server-count">
            {t("servers", { count: profile.servers.length })}
          </Badge>
        </div>
      </div>
    </li>
  );
}

export default function ProfilesPage() {
  const t = useTranslations("profiles");
  const { me } = useSession();
  const profiles = useResource((signal) => api.profiles(signal), [me.user.id]);
  // The plaintext token of the profile just created: shown once, dropped when the dialog closes.
  const [created, setCreated] = useState<{ token: string; slug: string } | null>(null);

  function onCreated(profile: Profile) {
    if (profile.token) setCreated({ token: profile.token, slug: profile.slug });
    profiles.reload();
  }

  return (
    <>
      <PageHeader title={t("title")} description={t("description")} />
      <div className="flex flex-col gap-6">
        <CreateProfileForm onCreated={onCreated} />
        <Card>
          <CardHeader title={t("list.title")} />
          {profiles.error ? (
            <ErrorState error={profiles.error} onRetry={profiles.reload} />
          ) : profiles.data === undefined ? (
            <ListSkeleton rows={3} label={t("list.loading")} />
          ) : profiles.data.length === 0 ? (
            <EmptyState title={t("list.empty")}>{t("list.emptyHint")}</EmptyState>
          ) : (
            <ul aria-label={t("list.title")} data-testid="profile-list">
              {profiles.data.map((profile) => (
                <ProfileRow key={profile.id} profile={profile} />
              ))}
            </ul>
          )}
        </Card>
      </div>
      <TokenDialog
        token={created?.token ?? null}
        slug={created?.slug ?? ""}
        title={t("token.createdTitle")}
        onClose={() => setCreated(null)}
      />
    </>
  );
}
