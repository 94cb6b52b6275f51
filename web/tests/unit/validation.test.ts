import { describe, expect, it } from "vitest";

import {
  credentialBody,
  credentialFieldOf,
  credentialServer,
  EMPTY_CREDENTIAL_FORM,
  findInvalidHost,
  hasErrors,
  parseHosts,
  slugFromName,
  validateAllowedHosts,
  validateCredentialForm,
  validateHost,
  validateInjectFormat,
  validateInjectHeader,
  validatePlaceholder,
  validateProfileName,
  validateSecret,
  validateServerName,
  validateSlug,
  type CredentialForm,
} from "@/lib/validation";

const form = (fields: Partial<CredentialForm>): CredentialForm => ({ ...EMPTY_CREDENTIAL_FORM, ...fields });

describe("profile name", () => {
  it("takes 1 to 128 characters", () => {
    expect(validateProfileName("a")).toBeNull();
    expect(validateProfileName("x".repeat(128))).toBeNull();
    expect(validateProfileName("x".repeat(129))).toBe("validation.nameTooLong");
  });

  it("refuses an empty or blank name", () => {
    expect(validateProfileName("")).toBe("validation.nameRequired");
    expect(validateProfileName("   ")).toBe("validation.nameRequired");
  });

  it("counts characters, not UTF-16 units", () => {
    expect(validateProfileName("😀".repeat(128))).toBeNull();
    expect(validateProfileName("😀".repeat(129))).toBe("validation.nameTooLong");
    expect(validateProfileName("Größe Ünïcödé")).toBeNull();
  });

  it("refuses control characters", () => {
    expect(validateProfileName("a\tb")).toBe("validation.nameControl");
    expect(validateProfileName("a\u007fb")).toBe("validation.nameControl");
  });
});

describe("slug", () => {
  it("takes 2 to 63 characters", () => {
    expect(validateSlug("ab")).toBeNull();
    expect(validateSlug("a".repeat(63))).toBeNull();
    expect(validateSlug("a")).toBe("validation.slugLength");
    expect(validateSlug("a".repeat(64))).toBe("validation.slugLength");
    expect(validateSlug("")).toBe("validation.slugRequired");
  });

  it("starts with a letter or digit and may hold hyphens", () => {
    expect(validateSlug("0-team")).toBeNull();
    expect(validateSlug("my-team-")).toBeNull();
    expect(validateSlug("-team")).toBe("validation.slugStart");
  });

  it("refuses upper case, underscores, dots and spaces", () => {
    expect(validateSlug("Team")).toBe("validation.slugChars");
    expect(validateSlug("my_team")).toBe("validation.slugChars");
    expect(validateSlug("my.team")).toBe("validation.slugChars");
    expect(validateSlug("my team")).toBe("validation.slugChars");
  });
});

describe("slugFromName", () => {
  it("suggests a valid slug from a display name", () => {
    expect(slugFromName("My Team")).toBe("my-team");
    expect(slugFromName("  Research & Development!  ")).toBe("research-development");
    expect(slugFromName("Größe Übersicht")).toBe("groesse-uebersicht");
    expect(slugFromName("Café crème")).toBe("cafe-creme");
    expect(slugFromName("--a__b--")).toBe("a-b");
    expect(validateSlug(slugFromName("My Team"))).toBeNull();
  });

  it("is at most 63 characters and never ends in a hyphen", () => {
    const slug = slugFromName(`${"a".repeat(62)} b`);
    expect(slug).toBe("a".repeat(62));
    expect(slugFromName("x".repeat(200))).toHaveLength(63);
    expect(validateSlug(slugFromName("word ".repeat(40)))).toBeNull();
  });

  it("may be empty when nothing is usable", () => {
    expect(slugFromName("!!!")).toBe("");
    expect(slugFromName("日本")).toBe("");
  });
});

describe("credential server name", () => {
  it("takes 1 to 64 characters", () => {
    expect(validateServerName("a")).toBeNull();
    expect(validateServerName("a".repeat(64))).toBeNull();
    expect(validateServerName("a".repeat(65))).toBe("validation.serverTooLong");
    expect(validateServerName("")).toBe("validation.serverRequired");
  });

  it("allows hyphens and underscores after the first character", () => {
    expect(validateServerName("git_hub-2")).toBeNull();
    expect(validateServerName("_github")).toBe("validation.serverStart");
    expect(validateServerName("-github")).toBe("validation.serverStart");
  });

  it("refuses upper case and other characters", () => {
    expect(validateServerName("GitHub")).toBe("validation.serverChars");
    expect(validateServerName("git.hub")).toBe("validation.serverChars");
    expect(validateServerName("git/hub")).toBe("validation.serverChars");
  });
});

describe("secret", () => {
  it("is required", () => {
    expect(validateSecret("")).toBe("validation.secretRequired");
    expect(validateSecret("s")).toBeNull();
  });

  it("is at most 64 KiB of UTF-8", () => {
    expect(validateSecret("x".repeat(65536))).toBeNull();
    expect(validateSecret("x".repeat(65537))).toBe("validation.secretTooLarge");
    // 2 bytes each: 32768 characters are 64 KiB, one more is too large.
    expect(validateSecret("é".repeat(32768))).toBeNull();
    expect(validateSecret("é".repeat(32769))).toBe("validation.secretTooLarge");
  });

  it("refuses line breaks and NUL", () => {
    expect(validateSecret("abc\n")).toBe("validation.secretLineBreak");
    expect(validateSecret("a\rb")).toBe("validation.secretLineBreak");
    expect(validateSecret("a\u0000b")).toBe("validation.secretLineBreak");
  });
});

describe("inject header", () => {
  it("is optional", () => {
    expect(validateInjectHeader("")).toBeNull();
  });

  it("takes header-name characters, at most 64", () => {
    expect(validateInjectHeader("X-Api-Key")).toBeNull();
    expect(validateInjectHeader("a".repeat(64))).toBeNull();
    expect(validateInjectHeader("a".repeat(65))).toBe("validation.headerTooLong");
    expect(validateInjectHeader("X_Api_Key")).toBe("validation.headerChars");
    expect(validateInjectHeader("X-Api-Key:")).toBe("validation.headerChars");
    expect(validateInjectHeader("X Api")).toBe("validation.headerChars");
  });
});

describe("inject format", () => {
  it("is optional and must contain {token}", () => {
    expect(validateInjectFormat("")).toBeNull();
    expect(validateInjectFormat("Bearer {token}")).toBeNull();
    expect(validateInjectFormat("{token}")).toBeNull();
    expect(validateInjectFormat("Bearer token")).toBe("validation.formatToken");
    expect(validateInjectFormat("Bearer {TOKEN}")).toBe("validation.formatToken");
  });

  it("is at most 256 characters", () => {
    expect(validateInjectFormat(`${"x".repeat(249)}{token}`)).toBeNull();
    expect(validateInjectFormat(`${"x".repeat(250)}{token}`)).toBe("validation.formatTooLong");
  });

  it("refuses line breaks", () => {
    expect(validateInjectFormat("Bearer {token}\n")).toBe("validation.formatLineBreak");
  });
});

describe("placeholder", () => {
  it("is optional and 8 to 256 characters", () => {
    expect(validatePlaceholder("")).toBeNull();
    expect(validatePlaceholder("x".repeat(7))).toBe("validation.placeholderLength");
    expect(validatePlaceholder("x".repeat(8))).toBeNull();
    expect(validatePlaceholder("x".repeat(256))).toBeNull();
    expect(validatePlaceholder("x".repeat(257))).toBe("validation.placeholderLength");
  });

  it("refuses control characters", () => {
    expect(validatePlaceholder("PLACE\tHOLDER")).toBe("validation.placeholderControl");
  });
});

describe("allowed hosts", () => {
  it("takes names and a leading *. wildcard", () => {
    expect(validateHost("api.github.com")).toBeNull();
    expect(validateHost("*.github.com")).toBeNull();
    expect(validateHost("10.0.0.1")).toBeNull();
    expect(validateHost("a-b.example")).toBeNull();
  });

  it("refuses upper case, a wildcard elsewhere, ports and schemes", () => {
    expect(validateHost("API.github.com")).toBe("validation.hostInvalid");
    expect(validateHost("api.*.com")).toBe("validation.hostInvalid");
    expect(validateHost("*github.com")).toBe("validation.hostInvalid");
    expect(validateHost("*")).toBe("validation.hostInvalid");
    expect(validateHost("*.")).toBe("validation.hostInvalid");
    expect(validateHost("github.com:443")).toBe("validation.hostInvalid");
    expect(validateHost("https://github.com")).toBe("validation.hostInvalid");
    expect(validateHost("")).toBe("validation.hostInvalid");
  });

  it("takes entries of at most 253 characters", () => {
    expect(validateHost("a".repeat(253))).toBeNull();
    expect(validateHost("a".repeat(254))).toBe("validation.hostTooLong");
    expect(validateHost(`*.${"a".repeat(251)}`)).toBeNull();
    expect(validateHost(`*.${"a".repeat(252)}`)).toBe("validation.hostTooLong");
  });

  it("takes at most 64 entries", () => {
    const hosts = (n: number) => Array.from({ length: n }, (_, i) => `h${i}.example.com`);
    expect(validateAllowedHosts([])).toBeNull();
    expect(validateAllowedHosts(hosts(64))).toBeNull();
    expect(validateAllowedHosts(hosts(65))).toBe("validation.hostsTooMany");
  });

  it("names the first refused entry", () => {
    expect(validateAllowedHosts(["ok.example", "Bad.example"])).toBe("validation.hostInvalid");
    expect(findInvalidHost(["ok.example", "Bad.example", "x y"])).toBe("Bad.example");
    expect(findInvalidHost(["ok.example"])).toBeUndefined();
  });

  it("parses one per line or comma-separated, trimmed and without duplicates", () => {
    expect(parseHosts("")).toEqual([]);
    expect(parseHosts(" a.example ,b.example\n\n*.c.example\r\nb.example, ")).toEqual([
      "a.example",
      "b.example",
      "*.c.example",
    ]);
  });
});

describe("credential form", () => {
  it("needs a server and a secret only", () => {
    expect(validateCredentialForm(form({ server: "github", secret: "ghp_x" }))).toEqual({});
    expect(validateCredentialForm(EMPTY_CREDENTIAL_FORM)).toEqual({
      server: "validation.serverRequired",
      secret: "validation.secretRequired",
    });
  });

  it("reports every field's problem", () => {
    const errors = validateCredentialForm({
      server: "Git",
      secret: "a\nb",
      header: "X Bad",
      format: "Bearer",
      placeholder: "short",
      hosts: "ok.example\nBAD",
    });
    expect(errors).toEqual({
      server: "validation.serverChars",
      secret: "validation.secretLineBreak",
      header: "validation.headerChars",
      format: "validation.formatToken",
      placeholder: "validation.placeholderLength",
      hosts: "validation.hostInvalid",
    });
    expect(hasErrors(errors)).toBe(true);
    expect(hasErrors({})).toBe(false);
  });

  it("builds the body without empty optional fields", () => {
    expect(credentialBody(form({ server: "github", secret: "s3cret", header: "  ", hosts: " \n, " }))).toEqual({
      secret: "s3cret",
    });
    expect(
      credentialBody({
        server: " github ",
        secret: " s3cret ",
        header: " X-Api-Key ",
        format: "Token {token}",
        placeholder: "SVCGATE_PLACEHOLDER",
        hosts: "api.github.com, *.githubusercontent.com",
      }),
    ).toEqual({
      secret: " s3cret ",
      inject_header: "X-Api-Key",
      inject_format: "Token {token}",
      placeholder: "SVCGATE_PLACEHOLDER",
      allowed_hosts: ["api.github.com", "*.githubusercontent.com"],
    });
    expect(credentialServer(form({ server: " github " }))).toBe("github");
  });
});

describe("credentialFieldOf", () => {
  it("places the gateway's message under the field it names", () => {
    expect(credentialFieldOf("allowed_hosts: wildcard over a public suffix")).toBe("hosts");
    expect(credentialFieldOf("allowed_hosts.0: String should match pattern")).toBe("hosts");
    expect(credentialFieldOf("inject_header must be 1 to 64 characters")).toBe("header");
    expect(credentialFieldOf("inject_format: too long")).toBe("format");
    expect(credentialFieldOf("placeholder must be 8 to 256 characters")).toBe("placeholder");
    expect(credentialFieldOf("secret must not be empty")).toBe("secret");
    expect(credentialFieldOf("server must match ^[a-z0-9]")).toBe("server");
    expect(credentialFieldOf("unknown field 'x'")).toBeNull();
    expect(credentialFieldOf("secrets are fine")).toBeNull();
  });
});
