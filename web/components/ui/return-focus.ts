"use client";

import { useRef } from "react";

/**
 * The dialogs here are opened from state, not from a Radix Trigger, so Radix cannot know
 * where focus came from: remember the focused element when the dialog opens and give focus
 * back to it when the dialog closes (if it is still in the page).
 */
export function useReturnFocus() {
  const opener = useRef<HTMLElement | null>(null);
  return {
    onOpenAutoFocus: () => {
      opener.current = document.activeElement instanceof HTMLElement ? document.activeElement : null;
    },
    onCloseAutoFocus: (event: Event) => {
      const target = opener.current;
      opener.current = null;
      if (target && target.isConnected) {
        event.preventDefault();
        target.focus();
      }
    },
  };
}
