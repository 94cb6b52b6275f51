"use client";

import { useTranslations } from "next-intl";
import type { FormEvent } from "react";
import { useState } from "react";

import { Button } from "@/components/ui/button";
import { Field, Input } from "@/components/ui/input";

/** Admins (not viewing as someone) may narrow the log to one user: the API's `user_id`. */
export function UserFilter({ value, onChange }: { value: number | undefined; onChange: (value: number | undefined) => void }) {
  const t = useTranslations("audit.filter");
  const [text, setText] = useState(value === undefined ? "" : String(value));
  const [error, setError] = useState<string | null>(null);

  function submit(event: FormEvent<HTMLFormElement>) {
    event.preventDefault();
    const trimmed = text.trim();
    if (trimmed === "") {
      setError(null);
      onChange(undefined);
      return;
    }
    if (!/^[1-9][0-9]{0,15}$/.test(trimmed)) {
      setError(t("userIdInvalid"));
      return;
    }
    setError(null);
    onChange(Number(trimmed));
  }

  return (
    <form onSubmit={submit} noValidate className="flex flex-col gap-2 sm:flex-row sm:items-start" data-testid="user-filter">
      <div className="sm:w-40">
        <Field label={t("userId")} error={error}>
          {(field) => (
            <Input
              {...field}
              data-testid="user-filter-id"
              inputMode="numeric"
              autoComplete="off"
              placeholder={t("userIdPlaceholder")}
              value={text}
              onChange={(event) => {
                setText(event.target.value);
                if (error) setError(null);
              }}
            />
          )}
        </Field>
      </div>
      <div className="flex gap-2 sm:mt-6">
        <Button type="submit" variant="secondary" data-testid="user-filter-apply">
          {t("apply")}
        </Button>
        {value !== undefined ? (
          <Button
            variant="ghost"
            data-testid="user-filter-clear"
            onClick={() => {
              setText("");
              setError(null);
              onChange(undefined);
            }}
          >
            {t("allUsers")}
          </Button>
        ) : null}
      </div>
    </form>
  );
}
