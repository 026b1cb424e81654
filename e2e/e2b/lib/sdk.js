// The SDK under test and what every test file shares: which e2b version
// runs (SDK=new|old), the server it talks to (from the environment, checked
// here so a missing variable fails every file at once with one clear
// message), a tag on every sandbox so leftovers can be found, and small
// waiting helpers.
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'

// Both versions are installed side by side under npm aliases (package.json).
// "new" creates and connects through /v2/sandboxes; "old" is the last release
// that still used POST /sandboxes and POST /sandboxes/{id}/connect.
const packages = { new: 'e2b-new', old: 'e2b-old', oldest: 'e2b-oldest' }

export const which = process.env.SDK || 'new'
const pkg = packages[which]
if (!pkg) {
  throw new Error(`SDK=${which}: want one of ${Object.keys(packages).join(', ')}`)
}

const require = createRequire(import.meta.url)
export const sdkVersion = JSON.parse(
  readFileSync(require.resolve(`${pkg}/package.json`), 'utf8')
).version

export const e2b = await import(pkg)
export const {
  Sandbox,
  CommandExitError,
  AuthenticationError,
  NotFoundError,
  SandboxError,
  TimeoutError,
  FileType,
  FilesystemEventType,
} = e2b
// FileNotFoundError and SandboxNotFoundError came after NotFoundError; an
// SDK without them throws NotFoundError where they would be thrown.
export const SandboxNotFoundError = e2b.SandboxNotFoundError ?? NotFoundError
export const FileNotFoundError = e2b.FileNotFoundError ?? NotFoundError

// What this SDK version can do, read from the SDK itself rather than from
// its version number, so a case is skipped only where the SDK has no such
// call. Each value is a skip reason, or false when the feature is there.
const proto = Sandbox.prototype
export const lacks = {
  pause:
    typeof proto.pause !== 'function' &&
    `e2b@${sdkVersion} has no Sandbox.pause`,
  connect:
    typeof Sandbox.connect !== 'function' &&
    `e2b@${sdkVersion} has no Sandbox.connect`,
  // Sandbox.list returned a promise of an array before it returned a
  // paginator (which sends nothing until nextItems).
  pagination: !hasPaginator() && `e2b@${sdkVersion} lists sandboxes without pagination`,
  snapshots:
    typeof proto.createSnapshot !== 'function' &&
    `e2b@${sdkVersion} has no Sandbox.createSnapshot`,
}

function hasPaginator() {
  const listed = Sandbox.list({ apiKey: 'probe', apiUrl: 'http://127.0.0.1:9' })
  if (typeof listed?.then === 'function') listed.then(undefined, () => {})
  return typeof listed?.nextItems === 'function'
}

// The server under test. The SDK reads the same variables itself; they are
// required here so that an unset one is named instead of the SDK quietly
// falling back to E2B's cloud.
const required = ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']
const missing = required.filter((name) => !process.env[name])
if (missing.length) {
  throw new Error(
    `set ${missing.join(', ')} (the sandboxd server to test and an e2b-format key; ` +
      'see e2e/e2b/README.md)'
  )
}
// These tests start sandboxes and send them traffic: they are meant for a
// server on this machine. E2B_ALLOW_REMOTE=1 lifts the check.
for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL']) {
  const host = new URL(process.env[name]).hostname
  const loopback =
    host === 'localhost' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host)
  if (!loopback && process.env.E2B_ALLOW_REMOTE !== '1') {
    throw new Error(`${name}=${process.env[name]} is not a loopback address (E2B_ALLOW_REMOTE=1 allows it)`)
  }
}
export const apiKey = process.env.E2B_API_KEY

// Every sandbox a test creates carries this metadata, so list filters see
// only this run's sandboxes and cleanup() can find what a failed test left.
export const runId = `${which}-${process.pid}-${Date.now()}`
export const tag = { e2etest: runId }

// A short sandbox lifetime: a test that dies without killing its sandbox
// leaves it for two minutes at most.
export const shortTimeoutMs = 120_000

// Test options: a generous per-test limit, so a server that never answers
// fails the test instead of hanging the run.
export const slow = { timeout: 180_000 }

// create makes a sandbox from the default template with this run's tag and a
// short timeout (opts may add or override).
export async function create(opts = {}) {
  return Sandbox.create({
    timeoutMs: shortTimeoutMs,
    ...opts,
    metadata: { ...tag, ...(opts.metadata ?? {}) },
  })
}

// kill ends a sandbox and ignores every error: it is for finally blocks,
// where the test's own failure is the one worth reporting.
export async function kill(sbx) {
  if (sbx) await sbx.kill().catch(() => {})
}

// cleanup kills whatever this run's sandboxes are still listed; a file's
// after() calls it. Errors are ignored for the same reason as in kill.
export async function cleanup() {
  try {
    const pages = Sandbox.list({ query: { metadata: tag } })
    const ids = []
    if (typeof pages.nextItems === 'function') {
      while (pages.hasNext) ids.push(...(await pages.nextItems()).map((s) => s.sandboxId))
    } else {
      ids.push(...(await pages).map((s) => s.sandboxId))
    }
    await Promise.all(ids.map((id) => Sandbox.kill(id).catch(() => {})))
  } catch {
    // nothing more to do
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// waitFor polls fn until it returns a truthy value and returns it, or fails
// with what (a string, or a function giving one then) and fn's last error
// after timeoutMs.
export async function waitFor(what, fn, { timeoutMs = 20_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      const v = await fn()
      if (v) return v
      last = undefined
    } catch (err) {
      last = err
    }
    if (Date.now() > deadline) {
      const said = typeof what === 'function' ? what() : what
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${said}${last ? `: ${last.stack ?? last}` : ''}`)
    }
    await sleep(intervalMs)
  }
}

// title names a suite after the area and the SDK version, so a report says
// which version a failure belongs to.
export const title = (area) => `${area} (e2b@${sdkVersion})`

// closeTo asserts |got - want| <= tolerance, for timestamps.
export function closeTo(got, want, tolerance, what) {
  if (!(Math.abs(got - want) <= tolerance)) {
    throw new Error(`${what}: got ${got}, want ${want} ± ${tolerance}`)
  }
}

// sameText asserts got === want for texts too long to print whole: a
// failure names what, both lengths and where they first differ.
export function sameText(got, want, what) {
  if (got === want) return
  const s = String(got)
  let i = 0
  while (i < s.length && i < want.length && s[i] === want[i]) i++
  const around = (t) => JSON.stringify(t.slice(Math.max(0, i - 20), i + 40))
  throw new Error(
    `${what}: got ${s.length} characters, want ${want.length}; they differ at ${i}: got ${around(s)}, want ${around(want)}`
  )
}

// shared is a sandbox for the tests of one file, made when the first test
// that runs asks for it (so a name filter that skips the file's tests
// starts none) and killed by done.
export function shared(opts = { timeoutMs: 300_000 }) {
  let made
  return {
    get: () => (made ??= create(opts)),
    done: async () => {
      if (made) await kill(await made.catch(() => undefined))
    },
  }
}
