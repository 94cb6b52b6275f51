"use client";

import { useRouter } from "next/navigation";
import { useTranslations } from "next-intl";
import { useEffect } from "react";

import { LanguageSwitcher } from "@/components/shell/language-switcher";
import { ThemeSwitcher } from "@/components/shell/theme-switcher";
import { Card } from "@/components/ui/card";
import { ListSkeleton } from "@/components/ui/skeleton";
import { ErrorState } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import { useResource } from "@/lib/use-resource";

const VARIABLES = ["SVC_OIDC_ISSUER", "SVC_OIDC_CLIENT_ID", "SVC_OIDC_REDIRECT_URL"] as const;

/** `/api/me` first: signed in goes home, a disabled control plane explains itself. */
export function LoginView() {
  const t = useTranslations("login");
  const router = useRouter();
  const me = useResource((signal) => api.me(signal));
  const error = me.error instanceof ApiError ? me.error : null;
  const disabled = error?.code === "control_plane_disabled";
  const signedOut = error?.code === "unauthenticated";

  useEffect(() => {
    if (me.data) router.replace("/");
  }, [me.data, router]);

  let body;
  if (disabled) {
    body = (
      <div data-testid="control-plane-disabled">
        <h1 className="text-xl font-semibold">{t("disabledTitle")}</h1>
        <p className="mt-2 text-sm text-muted-foreground">{t("disabledIntro")}</p>
        <dl className="mt-4 space-y-2">
          {VARIABLES.map((name) => (
            <div key={name}>
              <dt>
                <code className="rounded bg-muted px-1.5 py-0.5 text-sm font-semibold">{name}</code>
              </dt>
              <dd className="ml-1 text-sm text-muted-foreground">{t(`variables.${name}`)}</dd>
            </div>
          ))}
        </dl>
        <p className="mt-4 text-xs text-muted-foreground">
          {t("gatewaySays")} <span className="break-words">{error?.message}</span>
        </p>
      </div>
    );
  } else if (signedOut) {
    body = (
      <div>
        <h1 className="text-xl font-semibold">{t("title")}</h1>
        <p className="mt-2 text-sm text-muted-foreground">{t("intro")}</p>
        {/* A plain link: the gateway answers with a redirect to the identity provider. */}
        <a
          href="/api/auth/login"
          data-testid="sign-in"
          className="mt-6 inline-flex h-10 w-full items-center justify-center rounded-md bg-primary px-4 text-sm font-medium text-primary-foreground hover:opacity-90 focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring focus-visible:ring-offset-2"
        >
          {t("signIn")}
        </a>
      </div>
    );
  } else if (me.error) {
    body = <ErrorState error={me.error} onRetry={me.reload} />;
  } else {
    body = <ListSkeleton rows={2} label={t("checking")} />;
  }

  return (
    <main className="flex min-h-screen flex-col items-center justify-center gap-4 p-4">
      <div className="flex gap-2">
        <ThemeSwitcher />
        <LanguageSwitcher />
      </div>
      <Card className="w-full max-w-md">{body}</Card>
    </main>
  );
}
