"use client";

import Link from "next/link";
import { usePathname, useRouter } from "next/navigation";
import { useTranslations } from "next-intl";
import type { ReactNode } from "react";
import { useEffect, useState } from "react";

import { SessionProvider, sessionFrom, type Session } from "@/components/session";
import { Badge } from "@/components/ui/badge";
import { Button } from "@/components/ui/button";
import { MutationButton } from "@/components/ui/mutation-button";
import { ListSkeleton } from "@/components/ui/skeleton";
import { ErrorState, InlineError } from "@/components/ui/states";
import { api, ApiError } from "@/lib/api/client";
import { cn } from "@/lib/cn";
import { useResource } from "@/lib/use-resource";

import { LanguageSwitcher } from "./language-switcher";
import { ThemeSwitcher } from "./theme-switcher";

const NAV = [
  { href: "/", key: "overview" },
  { href: "/servers", key: "servers" },
  { href: "/profiles", key: "profiles" },
  { href: "/credentials", key: "credentials" },
  { href: "/users", key: "users", admin: true },
  { href: "/audit", key: "audit" },
] as const;

function isActive(pathname: string, href: string): boolean {
  return href === "/" ? pathname === "/" : pathname === href || pathname.startsWith(`${href}/`);
}

/** Signed-in pages: loads `/api/me` (401 or a disabled control plane go to /login). */
export function AppShell({ children }: { children: ReactNode }) {
  const t = useTranslations("common");
  const router = useRouter();
  const me = useResource((signal) => api.me(signal));
  const needsLogin =
    me.error instanceof ApiError &&
    (me.error.code === "unauthenticated" || me.error.code === "control_plane_disabled");

  useEffect(() => {
    if (needsLogin) router.replace("/login");
  }, [needsLogin, router]);

  if (me.data === undefined) {
    return (
      <div className="mx-auto max-w-5xl p-6">
        {me.error && !needsLogin ? (
          <ErrorState error={me.error} onRetry={me.reload} />
        ) : (
          <ListSkeleton rows={4} label={t("loading")} />
        )}
      </div>
    );
  }
  const session = sessionFrom(me.data, me.reload);
  return (
    <SessionProvider value={session}>
      <Frame session={session}>{children}</Frame>
    </SessionProvider>
  );
}

function Frame({ session, children }: { session: Session; children: ReactNode }) {
  const t = useTranslations("common");
  const pathname = usePathname();
  const router = useRouter();
  const [error, setError] = useState<unknown>(null);
  const [busy, setBusy] = useState(false);
  const { me } = session;
  const real = me.real_user ?? me.user;

  async function signOut() {
    setBusy(true);
    setError(null);
    try {
      await api.logout();
      router.replace("/login");
    } catch (cause) {
      setError(cause);
      setBusy(false);
    }
  }

  return (
    <div className="flex min-h-screen flex-col">
      <a href="#main" className="sr-only focus:not-sr-only focus:absolute focus:left-2 focus:top-2 focus:z-50 focus:rounded focus:bg-card focus:p-2">
        {t("skipToContent")}
      </a>
      {me.impersonating ? <ViewAsBanner session={session} /> : null}
      <header className="border-b bg-card">
        <div className="mx-auto flex max-w-6xl flex-wrap items-center justify-between gap-3 px-4 py-3">
          <Link href="/" className="text-lg font-semibold tracking-tight">
            {t("appName")}
          </Link>
          <div className="flex flex-wrap items-center gap-2">
            <ThemeSwitcher />
            <LanguageSwitcher />
            <span className="hidden text-sm text-muted-foreground sm:inline" data-testid="signed-in-user">
              {t("signedInAs", { name: real.display_name || real.email })}
            </span>
            <Badge tone={real.role === "admin" ? "info" : "neutral"}>{t(`roles.${real.role}`)}</Badge>
            <MutationButton
              variant="ghost"
              size="sm"
              onClick={signOut}
              disabled={busy}
            >
              {t("signOut")}
            </MutationButton>
          </div>
        </div>
        <nav aria-label={t("nav.label")} className="mx-auto max-w-6xl overflow-x-auto px-2">
          <ul className="flex gap-1">
            {NAV.filter((item) => !("admin" in item) || session.isAdmin).map((item) => {
              const active = isActive(pathname, item.href);
              return (
                <li key={item.href}>
                  <Link
                    href={item.href}
                    aria-current={active ? "page" : undefined}
                    className={cn(
                      "inline-block whitespace-nowrap border-b-2 px-3 py-2 text-sm",
                      active ? "border-primary font-medium text-foreground" : "border-transparent text-muted-foreground hover:text-foreground",
                    )}
                  >
                    {t(`nav.${item.key}`)}
                  </Link>
                </li>
              );
            })}
          </ul>
        </nav>
      </header>
      {error ? (
        <div className="mx-auto w-full max-w-6xl px-4 pt-3">
          <InlineError error={error} />
        </div>
      ) : null}
      <main id="main" className="mx-auto w-full max-w-6xl flex-1 px-4 py-6">
        {/* A page's data belongs to the effective user: remount it when that changes. */}
        <div key={`${me.user.id}:${me.impersonating}`}>{children}</div>
      </main>
    </div>
  );
}

function ViewAsBanner({ session }: { session: Session }) {
  const t = useTranslations("common.viewAs");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const { user } = session.me;

  async function stop() {
    setBusy(true);
    setError(null);
    try {
      await api.stopViewAs();
      // The shell remounts the page for the real user (see the key on <main>'s content).
      session.reload();
    } catch (cause) {
      setError(cause);
    }
    setBusy(false);
  }

  return (
    <div role="region" aria-label={t("stop")} data-testid="view-as-banner" className="bg-warn-muted text-foreground">
      <div className="mx-auto flex max-w-6xl flex-wrap items-center justify-between gap-2 px-4 py-2 text-sm">
        <p className="font-medium">{t("banner", { name: user.display_name || user.email, email: user.email })}</p>
        <div className="flex items-center gap-2">
          <InlineError error={error} />
          <Button size="sm" variant="secondary" onClick={stop} disabled={busy}>
            {t("stop")}
          </Button>
        </div>
      </div>
    </div>
  );
}
