"use client";

import { createContext, useContext } from "react";

import type { Me } from "@/lib/api/types";

export interface Session {
  me: Me;
  /** Viewing as another user: every mutating control is disabled. */
  readOnly: boolean;
  /** The real (signed-in) user is an admin; admin checks never use the viewed user. */
  isAdmin: boolean;
  reload: () => void;
}

const SessionContext = createContext<Session | null>(null);

export const SessionProvider = SessionContext.Provider;

export function sessionFrom(me: Me, reload: () => void): Session {
  const real = me.real_user ?? me.user;
  return { me, readOnly: me.impersonating, isAdmin: real.role === "admin", reload };
}

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (session === null) throw new Error("useSession outside the signed-in layout");
  return session;
}
