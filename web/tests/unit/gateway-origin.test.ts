import { describe, expect, it } from "vitest";

import { DEFAULT_GATEWAY_URL, gatewayOrigin } from "@/lib/gateway-origin";

describe("SVC_GATEWAY_URL", () => {
  it("defaults to the gateway's default listener", () => {
    expect(gatewayOrigin(undefined)).toBe(DEFAULT_GATEWAY_URL);
    expect(gatewayOrigin("  ")).toBe(DEFAULT_GATEWAY_URL);
  });

  it("accepts an origin, with or without a trailing slash", () => {
    expect(gatewayOrigin("http://10.0.0.5:8080/")).toBe("http://10.0.0.5:8080");
    expect(gatewayOrigin("https://gw.internal")).toBe("https://gw.internal");
  });

  it("refuses what is not an http(s) origin", () => {
    for (const bad of ["gateway:8080", "ftp://x", "http://x/api", "http://x/?a=1", "http://u:p@x", "not a url"]) {
      expect(() => gatewayOrigin(bad), bad).toThrow(/SVC_GATEWAY_URL/);
    }
  });
});
