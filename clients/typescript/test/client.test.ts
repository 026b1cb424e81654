// The package's tests: its generated types are those of the committed
// document, and its calls work against a real server (the Go test
// e2e/clients_typed_test.go starts one and sets SANDBOXD_URL,
// SANDBOXD_API_KEY and SANDBOXD_OTHER_API_KEY, two accounts' keys).
// Compiled with the package (npm test), so a call that does not fit the
// generated types fails before anything runs.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";

import { check, createClient, SandboxdError, type Schemas } from "../src/index.js";

// The package's directory, from dist/test/.
const root = fileURLToPath(new URL("../../", import.meta.url));

test("src/schema.ts is what openapi-typescript makes of api/openapi.json", () => {
  const out = join(mkdtempSync(join(tmpdir(), "sandboxd-ts-")), "schema.ts");
  execFileSync(
    process.execPath,
    [join(root, "node_modules", "openapi-typescript", "bin", "cli.js"), join(root, "..", "..", "api", "openapi.json"), "--output", out],
    { stdio: "pipe" },
  );
  assert.ok(
    readFileSync(out, "utf8") === readFileSync(join(root, "src", "schema.ts"), "utf8"),
    "src/schema.ts differs from the committed document's types: run `npm run generate` and commit the result",
  );
});

const url = process.env.SANDBOXD_URL;
const key = process.env.SANDBOXD_API_KEY ?? "";
const otherKey = process.env.SANDBOXD_OTHER_API_KEY ?? "";
const server = { skip: url ? false : "SANDBOXD_URL is not set (go test ./e2e -run TestTypedClients sets it)" };

// isError returns a predicate for assert.rejects: a SandboxdError with
// this status (and message, and missing_fields, when given).
function isError(status: number, message?: string, fields?: unknown[]) {
  return (e: unknown) => {
    assert.ok(e instanceof SandboxdError, `${e} is not a SandboxdError`);
    assert.equal(e.status, status);
    assert.equal(e.body?.status, "error");
    if (message !== undefined) assert.equal(e.body?.error, message);
    if (fields !== undefined) assert.deepEqual(e.body?.missing_fields, fields);
    return true;
  };
}

test("a sandbox's life, and the API's errors", server, async () => {
  const api = createClient(url!, key);

  const created = await check(
    api.POST("/api/sandboxes", { body: { command: "sh", args: ["-c", "echo typed > typed.txt"] } }),
  );
  const sb = created.sandboxes[0];
  assert.equal(sb.sandboxStatus, "running");
  assert.ok(sb.runId);
  const id = sb.sandboxId;

  // The run commits typed.txt to the account's repository.
  let run: Schemas["Run"];
  for (const deadline = Date.now() + 120_000; ; await sleep(100)) {
    const runs = await check(api.GET("/api/tasks/runs", { params: { query: { runId: sb.runId } } }));
    run = runs.runs[0];
    if (run.isCompleted || Date.now() > deadline) break;
  }
  assert.equal(run.status, "COMPLETED", JSON.stringify(run));
  assert.equal(run.output?.exitCode, 0);

  const ex = await check(
    api.POST("/api/sandboxes/{id}/exec", { params: { path: { id } }, body: { command: "cat", args: ["typed.txt"] } }),
  );
  assert.equal(ex.exitCode, 0);
  assert.equal(ex.stdout, "typed\n");

  const list = await check(api.GET("/api/sandboxes"));
  assert.ok(list.sandboxes.some((s) => s.sandboxId === id && s.sandboxStatus === "running"), JSON.stringify(list.sandboxes));
  assert.ok(list.filetree?.some((e) => e.path === "typed.txt"), JSON.stringify(list.filetree));

  const file = await check(api.GET("/api/sandboxes/file", { params: { query: { path: "typed.txt" } } }));
  assert.equal(file.content, "typed\n");
  assert.equal(file.encoding, undefined);

  const wrong = createClient(url!, "sbx_not_a_key");
  await assert.rejects(check(wrong.GET("/api/sandboxes")), isError(401, "Unauthorized"));

  const other = createClient(url!, otherKey);
  await assert.rejects(
    check(other.POST("/api/sandboxes/{id}/exec", { params: { path: { id } }, body: { command: "true" } })),
    isError(404, "Sandbox not found"),
  );
  await assert.rejects(
    check(other.GET("/api/sandboxes/file", { params: { query: { path: "typed.txt" } } })),
    isError(404),
  );

  await assert.rejects(
    check(api.POST("/api/sandboxes/{id}/exec", { params: { path: { id } }, body: { command: "" } })),
    isError(400, "command cannot be empty", ["command"]),
  );

  const stopped = await check(api.POST("/api/sandboxes/{id}/stop", { params: { path: { id } }, body: {} }));
  assert.ok(["stopping", "stopped"].includes(stopped.sandbox.sandboxStatus), stopped.sandbox.sandboxStatus);
  await assert.rejects(
    check(api.POST("/api/sandboxes/{id}/exec", { params: { path: { id } }, body: { command: "true" } })),
    isError(409),
  );
});
