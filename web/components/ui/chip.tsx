import type { ButtonHTMLAttributes } from "react";

import { cn } from "@/lib/cn";

/** A toggle chip (a real button with `aria-pressed`), e.g. a client-side filter. */
export function Chip({
  pressed,
  className,
  children,
  type,
  ...props
}: ButtonHTMLAttributes<HTMLButtonElement> & { pressed: boolean }) {
  return (
    <button
      type={type ?? "button"}
      aria-pressed={pressed}
      data-state={pressed ? "on" : "off"}
      className={cn(
        "inline-flex h-8 items-center gap-1 rounded-full border px-3 text-sm font-medium transition",
        "focus-visible:outline-none focus-visible:ring-2 focus-visible:ring-ring focus-visible:ring-offset-2",
        "focus-visible:ring-offset-background disabled:pointer-events-none disabled:opacity-50",
        pressed ? "border-primary bg-primary text-primary-foreground" : "bg-card text-foreground hover:bg-accent",
        className,
      )}
      {...props}
    >
      {pressed ? <span aria-hidden="true">✓</span> : null}
      {children}
    </button>
  );
}
