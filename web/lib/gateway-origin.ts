/** The gateway address the dashboard's rewrites point at (build time only). */
export const DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080";

export function gatewayOrigin(value: string | undefined): string {
  const raw = value === undefined || value.trim() === "" ? DEFAULT_GATEWAY_URL : value.trim();
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new Error(`SVC_GATEWAY_URL is not a URL: ${raw}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new Error(`SVC_GATEWAY_URL must be http:// or https://: ${raw}`);
  }
  if (url.pathname !== "/" || url.search !== "" || url.hash !== "" || url.username !== "") {
    throw new Error(`SVC_GATEWAY_URL must be an origin such as http://127.0.0.1:8080: ${raw}`);
  }
  return url.origin;
}
