"use client";

import Link from "next/link";
import { useParams } from "next/navigation";
import { useTranslations } from "next-intl";

import { BundleCard } from "@/components/profiles/bundle-card";
import { DeleteProfileCard } from "@/components/profiles/delete-profile-card";
import { EndpointCard } from "@/components/profiles/endpoint-card";
import { RenameCard } from "@/components/profiles/rename-card";
import { RotateTokenCard } from "@/components/profiles/rotate-token-card";
import { RuntimeCard } from "@/components/profiles/runtime-card";
import { PageHeader } from "@/components/ui/page-header";
import { ListSkeleton } from "@/components/ui/skeleton";
import { EmptyState, ErrorState } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import type { Profile } from "@/lib/api/types";
import { useResource } from "@/lib/use-resource";

/** Profile ids are positive integers; anything else is not found without asking the gateway. */
function profileId(raw: string | string[] | undefined): string | null {
  const value = Array.isArray(raw) ? raw[0] : raw;
  return value !== undefined && /^[1-9][0-9]{0,18}$/.test(value) ? value : null;
}

function BackLink() {
  const t = useTranslations("profiles.detail");
  return (
    <Link
      href="/profiles"
      data-testid="back-to-profiles"
      className="text-sm text-primary underline-offset-4 hover:underline focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring"
    >
      {t("back")}
    </Link>
  );
}

export default function ProfileDetailPage() {
  const t = useTranslations("profiles.detail");
  const params = useParams<{ id: string }>();
  const id = profileId(params.id);
  const profile = useResource<Profile | null>(
    (signal) => (id === null ? Promise.resolve(null) : api.profile(id, signal)),
    [id],
  );

  const { data } = profile;

  if (data === null || (profile.error instanceof ApiError && profile.error.code === "not_found")) {
    return (
      <>
        <PageHeader title={t("notFoundTitle")} />
        <div data-testid="profile-not-found">
          <EmptyState title={t("notFoundTitle")}>
            <p>{t("notFoundHint")}</p>
            <p className="mt-3">
              <BackLink />
            </p>
          </EmptyState>
        </div>
      </>
    );
  }

  if (data === undefined) {
    return (
      <>
        <div className="mb-4">
          <BackLink />
        </div>
        {profile.error ? (
          <ErrorState error={profile.error} onRetry={profile.reload} />
        ) : (
          <ListSkeleton rows={5} label={t("loading")} />
        )}
      </>
    );
  }

  const current = data;
  // A mutation's answer has no runtime (only GET has it): keep the last one, then reload it.
  const update = (next: Profile) => {
    profile.set({ ...current, ...next, runtime: next.runtime ?? current.runtime });
    profile.reload();
  };

  return (
    <>
      <div className="mb-2">
        <BackLink />
      </div>
      <PageHeader
        title={<span data-testid="profile-title">{current.name}</span>}
        description={
          <>
            <span className="sr-only">{t("slug")}: </span>
            <span className="font-mono" data-testid="profile-detail-slug">
              {current.slug}
            </span>
          </>
        }
      />
      {profile.error ? (
        <div className="mb-4">
          <ErrorState error={profile.error} onRetry={profile.reload} />
        </div>
      ) : null}
      <div className="grid gap-6 lg:grid-cols-2">
        <div className="flex min-w-0 flex-col gap-6">
          <EndpointCard profile={current} />
          <BundleCard profile={current} onSaved={update} />
        </div>
        <div className="flex min-w-0 flex-col gap-6">
          <RuntimeCard runtime={current.runtime} onRefresh={profile.reload} refreshing={profile.loading} />
          <RotateTokenCard profile={current} onRotated={update} />
          <RenameCard profile={current} onRenamed={update} />
          <DeleteProfileCard profile={current} />
        </div>
      </div>
    </>
  );
}
