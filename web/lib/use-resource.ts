"use client";

import { useCallback, useEffect, useRef, useState } from "react";

export interface Resource<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
  /** Loads again (retry buttons, after a change). Keeps the old data while it runs. */
  reload: () => void;
  /** Replaces the data locally (after a mutation that returned the new state). */
  set: (data: T) => void;
}

interface State<T> {
  data: T | undefined;
  error: unknown;
  loading: boolean;
}

/** Loads `loader` on mount, when `deps` change and on `reload()`; a newer load aborts an older one. */
export function useResource<T>(loader: (signal: AbortSignal) => Promise<T>, deps: readonly unknown[] = []): Resource<T> {
  const [state, setState] = useState<State<T>>({ data: undefined, error: null, loading: true });
  const [generation, setGeneration] = useState(0);
  const loaderRef = useRef(loader);
  useEffect(() => {
    loaderRef.current = loader;
  });

  useEffect(() => {
    const controller = new AbortController();
    loaderRef.current(controller.signal).then(
      (data) => {
        if (!controller.signal.aborted) setState({ data, error: null, loading: false });
      },
      (error: unknown) => {
        if (!controller.signal.aborted) setState((old) => ({ data: old.data, error, loading: false }));
      },
    );
    return () => controller.abort();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [generation, ...deps]);

  const reload = useCallback(() => {
    setState((old) => ({ ...old, loading: true }));
    setGeneration((n) => n + 1);
  }, []);
  const set = useCallback((data: T) => setState({ data, error: null, loading: false }), []);
  return { ...state, reload, set };
}
