import type { NextConfig } from "next";
import createNextIntlPlugin from "next-intl/plugin";

import { gatewayOrigin } from "./lib/gateway-origin";

/**
 * The gateway's internal address is read once, at build time (`SVC_GATEWAY_URL`, default
 * http://127.0.0.1:8080): `next build` writes the rewrites into the build, so changing the
 * address needs a rebuild. The browser only ever sees the dashboard's origin.
 */
const gateway = gatewayOrigin(process.env.SVC_GATEWAY_URL);

const config: NextConfig = {
  // Next gzips and buffers proxied `text/event-stream` responses; MCP streams must flow.
  compress: false,
  poweredByHeader: false,
  reactStrictMode: true,
  async rewrites() {
    return [
      { source: "/api/:path*", destination: `${gateway}/api/:path*` },
      { source: "/mcp/:path*", destination: `${gateway}/mcp/:path*` },
    ];
  },
};

export default createNextIntlPlugin("./i18n/request.ts")(config);
