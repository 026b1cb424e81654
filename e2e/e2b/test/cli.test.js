// The e2b CLI's sandbox commands against sandboxd: list, info, exec (with
// piped stdin), metrics, logs, pause, resume and kill, run as a user runs
// them, with E2B_API_URL and E2B_API_KEY pointing the CLI at the server.
// The CLI brings its own e2b SDK (package.json pins both), so this file
// runs once, with SDK=new.
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { mkdtempSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'

import { cleanup, create, kill, slow, tag, waitFor, which } from '../lib/sdk.js'

const require = createRequire(import.meta.url)
const cliDir = dirname(require.resolve('@e2b/cli/package.json'))
const cliVersion = require('@e2b/cli/package.json').version
// A home of its own: the CLI reads ~/.e2b/config.json, which must not
// decide anything here (the key comes from E2B_API_KEY).
const home = mkdtempSync(join(tmpdir(), 'e2b-cli-home-'))

// e2b runs the CLI with args, input on its stdin (a pipe, as a shell
// pipeline gives it), and resolves with its exit code and output. stdout
// is a pipe, so the CLI's update check does not run (it checks only on a
// terminal): nothing leaves this machine.
function e2b(args, input = '', env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(cliDir, 'dist', 'index.js'), ...args], {
      env: { ...process.env, HOME: home, NO_UPDATE_NOTIFIER: '1', NO_COLOR: '1', ...env },
      stdio: ['pipe', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => (stdout += d))
    child.stderr.on('data', (d) => (stderr += d))
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000)
    child.on('error', reject)
    child.on('close', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
    child.stdin.end(input)
  })
}

// ok runs e2b and fails with its output unless it exits 0.
async function ok(args, input) {
  const r = await e2b(args, input)
  assert.equal(r.code, 0, `e2b ${args.join(' ')}: exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`)
  return r
}

const metadataFlag = Object.entries(tag).map(([k, v]) => `${k}=${v}`).join(',')

describe(`e2b CLI ${cliVersion}`, { skip: which !== 'new' && 'the CLI brings its own SDK: run once' }, () => {
  after(cleanup)

  it('lists, shows, executes in, measures, logs, pauses, resumes and kills a sandbox', slow, async () => {
    const sbx = await create()
    try {
      const id = sbx.sandboxId

      const listed = JSON.parse((await ok(['sandbox', 'list', '--format', 'json', '--metadata', metadataFlag])).stdout)
      assert.deepEqual(listed.map((s) => s.sandboxId), [id])
      assert.equal(listed[0].state, 'running')
      assert.equal(listed[0].metadata.e2etest, tag.e2etest)

      const info = JSON.parse((await ok(['sandbox', 'info', id, '--format', 'json'])).stdout)
      assert.equal(info.sandboxId, id)
      assert.equal(info.state, 'running')

      // exec runs the command as E2B's exec does, stdin piped through
      // and closed, and exits with the command's code.
      assert.equal((await ok(['sandbox', 'exec', id, 'tr', 'a-z', 'A-Z'], 'piped through\n')).stdout, 'PIPED THROUGH\n')
      const failed = await e2b(['sandbox', 'exec', id, 'sh', '-c', 'echo out; exit 7'])
      assert.equal(failed.code, 7, failed.stderr)
      assert.equal(failed.stdout, 'out\n')

      // metrics: the history is sampled every 5 s from the start.
      const metrics = await waitFor('a metrics sample', async () => {
        const lines = (await ok(['sandbox', 'metrics', id, '--format', 'json'])).stdout.split('\n').filter((l) => l.startsWith('{'))
        return lines.length > 0 && lines.map((l) => JSON.parse(l))
      }, { timeoutMs: 30_000, intervalMs: 1000 })
      assert.ok(metrics[0].cpuCount >= 1 && metrics[0].memTotal > 0, JSON.stringify(metrics[0]))

      // pause, then resume, each seen by info and in the log.
      assert.match((await ok(['sandbox', 'pause', id])).stdout, /has been paused/)
      assert.equal(JSON.parse((await ok(['sandbox', 'info', id, '--format', 'json'])).stdout).state, 'paused')
      await ok(['sandbox', 'resume', id])
      assert.equal(JSON.parse((await ok(['sandbox', 'info', id, '--format', 'json'])).stdout).state, 'running')

      const logs = (await ok(['sandbox', 'logs', id, '--format', 'json'])).stdout
        .split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
      const messages = logs.map((l) => l.msg)
      for (const want of ['sandbox created', 'sandbox paused', 'sandbox resumed']) {
        assert.ok(messages.includes(want), `logs lack ${want}: ${JSON.stringify(logs)}`)
      }
      assert.ok(logs.every((l) => l.level.trim().toLowerCase() === 'info' && l.logger === 'lifecycle'), JSON.stringify(logs))

      assert.match((await ok(['sandbox', 'kill', id])).stdout, /has been killed/)
      const gone = JSON.parse((await ok(['sandbox', 'list', '--format', 'json', '--metadata', metadataFlag])).stdout)
      assert.deepEqual(gone, [])
      // The log outlives the sandbox, as E2B's does.
      const afterKill = (await ok(['sandbox', 'logs', id, '--format', 'json'])).stdout
      assert.match(afterKill, /sandbox stopped/)
    } finally {
      await kill(sbx)
    }
  })

  it('a sandbox that is not there is named as not found, and a bad key is refused', slow, async () => {
    const missing = await e2b(['sandbox', 'info', 'sbx-notthere0000000000', '--format', 'json'])
    assert.equal(missing.code, 1)
    assert.match(missing.stderr, /wasn't found/)
    const refused = await e2b(['sandbox', 'list', '--format', 'json'], '', { E2B_API_KEY: 'e2b_' + '0'.repeat(40) })
    assert.notEqual(refused.code, 0)
  })
})
