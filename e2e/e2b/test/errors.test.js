// How the SDK reports what goes wrong: a wrong API key, another account's
// key, a sandbox that was killed or never existed, a template that does not
// exist.
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import {
  AuthenticationError,
  Sandbox,
  SandboxError,
  SandboxNotFoundError,
  TimeoutError,
  cleanup,
  create,
  kill,
  lacks,
  sdkVersion,
  slow,
  tag,
  title,
  which,
} from '../lib/sdk.js'

// A key of the right form that no account has.
const wrongKey = 'e2b_' + '0123456789abcdef'.repeat(3).slice(0, 40)
// A sandbox ID that no sandbox has.
const missingId = 'i' + 'x'.repeat(19)

describe(title('errors'), () => {
  after(cleanup)

  it('a wrong API key is AuthenticationError for every control-plane call', slow, async () => {
    const sbx = await create()
    try {
      const opts = { apiKey: wrongKey }
      await assert.rejects(Sandbox.create({ ...opts, metadata: tag }), AuthenticationError, 'create')
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts), AuthenticationError, 'getInfo')
      await assert.rejects(Sandbox.kill(sbx.sandboxId, opts), AuthenticationError, 'kill')
      await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 60_000, opts), AuthenticationError, 'setTimeout')
      if (!lacks.connect) await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), AuthenticationError, 'connect')
      if (!lacks.pagination) await assert.rejects(Sandbox.list(opts).nextItems(), AuthenticationError, 'list')
      if (!lacks.pause) await assert.rejects(Sandbox.pause(sbx.sandboxId, opts), AuthenticationError, 'pause')
      // None of it touched the sandbox.
      assert.equal(await sbx.isRunning(), true)
      assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
    } finally {
      await kill(sbx)
    }
  })

  const otherKey = process.env.E2B_OTHER_API_KEY
  it(
    "another account's key finds no sandbox of this one",
    { ...slow, skip: !otherKey && 'E2B_OTHER_API_KEY (a key of a second account) is not set' },
    async () => {
      const sbx = await create()
      try {
        const opts = { apiKey: otherKey }
        await assert.rejects(Sandbox.getInfo(sbx.sandboxId, opts), SandboxNotFoundError, 'getInfo')
        assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false, 'kill with the other key')
        await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 60_000, opts), SandboxNotFoundError, 'setTimeout')
        if (!lacks.connect) await assert.rejects(Sandbox.connect(sbx.sandboxId, opts), SandboxNotFoundError, 'connect')
        if (!lacks.pagination) {
          const listed = await Sandbox.list({ ...opts, query: { metadata: tag } }).nextItems()
          assert.deepEqual(listed, [], 'the other account lists this run\'s sandboxes')
        }
        assert.equal(await sbx.isRunning(), true)
      } finally {
        await kill(sbx)
      }
    }
  )

  it('a killed sandbox is not found: connect, getInfo, setTimeout throw; kill says false', slow, async () => {
    const sbx = await create()
    try {
      assert.equal(await sbx.kill(), true)
      if (!lacks.connect) await assert.rejects(Sandbox.connect(sbx.sandboxId), SandboxNotFoundError, 'connect')
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'getInfo')
      await assert.rejects(sbx.setTimeout(60_000), SandboxNotFoundError, 'setTimeout')
      if (!lacks.pause) await assert.rejects(sbx.pause(), SandboxNotFoundError, 'pause')
      assert.equal(await sbx.kill(), false)
      assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    } finally {
      await kill(sbx)
    }
  })

  it('calls into a killed sandbox fail as the SDK reports a sandbox that is gone', slow, async () => {
    const sbx = await create()
    try {
      await sbx.kill()
      assert.equal(await sbx.isRunning(), false)
      // A process stream that cannot reach the sandbox: SandboxNotFoundError
      // ("Sandbox is probably not running anymore").
      await assert.rejects(sbx.commands.run('echo never'), SandboxNotFoundError, 'commands.run')
      // Other calls report it as the end of the sandbox's life.
      await assert.rejects(sbx.files.read('/home/user/x'), TimeoutError, 'files.read')
      await assert.rejects(sbx.files.list('/home/user'), TimeoutError, 'files.list')
    } finally {
      await kill(sbx)
    }
  })

  it('a sandbox ID that never existed is not found', slow, async () => {
    if (!lacks.connect) await assert.rejects(Sandbox.connect(missingId), SandboxNotFoundError, 'connect')
    await assert.rejects(Sandbox.getInfo(missingId), SandboxNotFoundError, 'getInfo')
    assert.equal(await Sandbox.kill(missingId), false)
  })

  it('create from a template that does not exist fails', slow, async () => {
    const err = await Sandbox.create('no-such-template-e2e', { metadata: tag, timeoutMs: 30_000 }).then(
      async (sbx) => {
        await kill(sbx)
        assert.fail('a sandbox was created from a template that does not exist')
      },
      (e) => e
    )
    assert.ok(err instanceof SandboxError, `got ${err?.stack ?? err}`)
    // SDKs before statusCode put the status at the start of the message.
    const status = err.statusCode ?? Number(/^(\d{3}):/.exec(err.message)?.[1])
    assert.ok([400, 404].includes(status), `status ${status}: ${err.message}`)
  })

  // (autoResume is done: autoresume.test.js; volumeMounts: volumes.test.js.)
  it('options sandboxd does not implement are refused, named, not ignored', { ...slow, skip: which !== 'new' && `e2b@${sdkVersion} is checked with SDK=new only` }, async () => {
    for (const [opts, name] of [
      [{ network: { maskRequestHost: 'app.example.com:${PORT}' } }, 'network.maskRequestHost'],
    ]) {
      const err = await Sandbox.create({ ...opts, metadata: tag, timeoutMs: 30_000 }).then(
        async (sbx) => {
          await kill(sbx)
          assert.fail(`a sandbox was created with ${name}`)
        },
        (e) => e
      )
      assert.ok(err instanceof SandboxError, `${name}: got ${err?.stack ?? err}`)
      assert.equal(err.statusCode, 400, `${name}: ${err.message}`)
      assert.match(err.message, new RegExp(`not supported by sandboxd: ${name.replace('.', '\\.')} \\(`), name)
    }
  })
})
