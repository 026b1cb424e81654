// A paused sandbox and its traffic: created with lifecycle { onTimeout:
// 'pause', autoResume: true }, traffic to its port through its E2B host,
// and an SDK call (commands.run), resume it and go through; without
// autoResume the port answers E2B's "not found" and the sandbox stays
// paused. pause({ keepMemory: false }) keeps the files alone: connect
// starts the sandbox again from them, its processes afresh, as does a
// create with lifecycle { onTimeout: { action: 'pause', keepMemory: false } }
// at its timeout.
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'

import { Sandbox, cleanup, create, kill, lacks, slow, title, waitFor } from '../lib/sdk.js'

// getPort fetches / from port of sbx through the E2B host getHost(port)
// names, on the server's one listener.
function getPort(sbx, port) {
  const base = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path: '/', headers: { Host: sbx.getHost(port) } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

// serve starts a page server on port 8000 of sbx and waits for it.
async function serve(sbx, page) {
  await sbx.commands.run(`mkdir -p /tmp/www && echo ${page} > /tmp/www/index.html`)
  // busybox's httpd where the image has it, else Python's.
  await sbx.commands.run(
    "if command -v busybox >/dev/null; then exec busybox httpd -f -p 8000 -h /tmp/www; else exec python3 -m http.server 8000 --directory /tmp/www; fi",
    { background: true }
  )
  let last
  await waitFor(() => `the page server at ${sbx.getHost(8000)}: ${JSON.stringify(last)}`, async () => (last = await getPort(sbx, 8000)).status === 200)
}

describe(title('auto-resume'), { skip: lacks.pause }, () => {
  after(cleanup)

  it('traffic resumes a paused sandbox created with autoResume, and only that one', slow, async () => {
    const resumable = await create({ allowInternetAccess: true, lifecycle: { onTimeout: 'pause', autoResume: true } })
    const sleeper = await create({ allowInternetAccess: true, lifecycle: { onTimeout: 'pause' } })
    try {
      await serve(resumable, 'awake')
      await serve(sleeper, 'asleep')
      const info = await Sandbox.getInfo(resumable.sandboxId)
      if (info.lifecycle) assert.equal(info.lifecycle.autoResume, true)

      assert.equal(await resumable.pause(), true)
      assert.equal(await sleeper.pause(), true)
      assert.equal((await Sandbox.getInfo(resumable.sandboxId)).state, 'paused')

      // Its port: the request waits for the resume, then goes through to
      // the server that ran before the pause.
      const got = await getPort(resumable, 8000)
      assert.equal(got.status, 200)
      assert.equal(got.body.trim(), 'awake')
      assert.equal((await Sandbox.getInfo(resumable.sandboxId)).state, 'running')

      // An SDK call resumes it too.
      assert.equal(await resumable.pause(), true)
      assert.equal((await resumable.commands.run('cat /tmp/www/index.html')).stdout.trim(), 'awake')

      // Without autoResume: E2B's answer, and it stays paused.
      const refused = await getPort(sleeper, 8000)
      assert.equal(refused.status, 502)
      assert.match(refused.body, /The sandbox was not found/)
      assert.equal((await Sandbox.getInfo(sleeper.sandboxId)).state, 'paused')
    } finally {
      await kill(resumable)
      await kill(sleeper)
    }
  })

  it('pause({ keepMemory: false }) keeps the files alone; connect starts it again from them', { ...slow, skip: lacks.connect }, async () => {
    const sbx = await create()
    try {
      await sbx.files.write('/home/user/kept.txt', 'kept')
      await sbx.commands.run('sleep 1000', { background: true })
      assert.equal((await sbx.commands.run('pgrep -x sleep >/dev/null && echo up')).stdout, 'up\n')
      await sbx.pause({ keepMemory: false })
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
      const back = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
      assert.equal(await back.files.read('/home/user/kept.txt'), 'kept')
      assert.equal((await back.commands.run('pgrep -x sleep || echo gone')).stdout, 'gone\n')
      // It runs as its user in its home again.
      assert.equal((await back.commands.run('whoami; pwd')).stdout, 'user\n/home/user\n')
    } finally {
      await kill(sbx)
    }
  })

  it("onTimeout { action: 'pause', keepMemory: false } pauses the files at the timeout", { ...slow, skip: lacks.connect }, async () => {
    const sbx = await create({ timeoutMs: 4_000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
    try {
      await sbx.files.write('/home/user/at-timeout.txt', 'kept')
      await waitFor('paused at its timeout', async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', { timeoutMs: 60_000, intervalMs: 500 })
      const back = await Sandbox.connect(sbx.sandboxId)
      assert.equal(await back.files.read('/home/user/at-timeout.txt'), 'kept')
    } finally {
      await kill(sbx)
    }
  })
})
