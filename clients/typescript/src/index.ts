// A typed client of the sandboxd API: the types are generated from the
// served OpenAPI document (src/schema.ts, by openapi-typescript; `npm run
// generate` after a change of api/openapi.json), the calls are
// openapi-fetch's. This file adds the API key and one error type.
import createFetchClient, { type Client, type ClientOptions } from "openapi-fetch";
import type { components, paths } from "./schema.js";

export type { components, paths, operations } from "./schema.js";

/** The schemas of the API: Schemas["Sandbox"], Schemas["Run"], ... */
export type Schemas = components["schemas"];

/** The body of every error answer: {"status": "error", "error", "missing_fields"?}. */
export type ErrorBody = Schemas["ErrorBody"];

/**
 * createClient returns a client of the server at baseUrl (such as
 * http://127.0.0.1:8080) that sends apiKey with every request:
 *
 *     const api = createClient("http://127.0.0.1:8080", process.env.SANDBOXD_API_KEY!);
 *     const { sandboxes } = await check(api.POST("/api/sandboxes", { body: {} }));
 */
export function createClient(
  baseUrl: string,
  apiKey: string,
  options: ClientOptions = {},
): Client<paths, "application/json"> {
  const headers = new Headers(options.headers as HeadersInit | undefined);
  headers.set("x-api-key", apiKey);
  // JSON only: exec's other answer, a text/event-stream, is not typed
  // by the document (its events are in docs/API.md), and leaving it out
  // keeps exec's data the ExecResponse.
  return createFetchClient<paths, "application/json">({ ...options, baseUrl, headers });
}

/** An answer of the API other than a success: its status and body. */
export class SandboxdError extends Error {
  readonly status: number;
  readonly body: ErrorBody | undefined;

  constructor(status: number, body: ErrorBody | undefined) {
    super(body?.error ? `HTTP ${status}: ${body.error}` : `HTTP ${status}`);
    this.name = "SandboxdError";
    this.status = status;
    this.body = body;
  }
}

/**
 * check awaits a call and returns the body of its success, or throws a
 * SandboxdError for any other answer, documented or not (a 409 or a 501
 * too), so that a caller needs one catch instead of a test per status.
 */
export async function check<T>(call: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
  const { data, error, response } = await call;
  if (!response.ok) {
    // openapi-fetch gives the body as JSON when it is JSON, else as text
    // (a proxy's page): then only the status tells what happened.
    const body = typeof error === "object" && error !== null && "error" in error ? (error as ErrorBody) : undefined;
    throw new SandboxdError(response.status, body);
  }
  return data as T;
}
