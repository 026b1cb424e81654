// A sandbox's life through the SDK's control-plane calls: create with its
// options, getInfo, setTimeout, list, pause and connect, kill and isRunning.
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import {
  Sandbox,
  SandboxNotFoundError,
  TimeoutError,
  cleanup,
  closeTo,
  create,
  kill,
  lacks,
  sdkVersion,
  shortTimeoutMs,
  slow,
  tag,
  title,
  waitFor,
  which,
} from '../lib/sdk.js'

describe(title('lifecycle'), () => {
  after(cleanup)

  it('create from template base applies timeout, metadata and envs', slow, async () => {
    const metadata = { ...tag, purpose: 'create-options', 'with space': 'a b=c&d' }
    const before = Date.now()
    const sbx = await Sandbox.create('base', {
      timeoutMs: 150_000,
      metadata,
      envs: { GREETING: 'hello from envs', SECOND: '2' },
    })
    try {
      assert.equal(typeof sbx.sandboxId, 'string')
      assert.ok(sbx.sandboxId.length > 0, 'sandboxId is empty')

      // envs are the environment of every command in the sandbox.
      const r = await sbx.commands.run('echo "$GREETING/$SECOND"')
      assert.equal(r.stdout, 'hello from envs/2\n')

      const info = await sbx.getInfo()
      assert.equal(info.sandboxId, sbx.sandboxId)
      // E2B answers a template's ID with its alias as name; either may be
      // the "base" the sandbox was created from.
      assert.ok(
        info.templateId === 'base' || info.name === 'base',
        `templateId ${JSON.stringify(info.templateId)} / name ${JSON.stringify(info.name)}: want base`
      )
      assert.deepEqual(info.metadata, metadata)
      assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), `startedAt ${info.startedAt}`)
      assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), `endAt ${info.endAt}`)
      closeTo(info.startedAt.getTime(), before, 60_000, 'startedAt against the time of create')
      closeTo(info.endAt - info.startedAt, 150_000, 10_000, 'endAt - startedAt against timeoutMs')
      assert.equal(info.state, 'running')
      assert.equal(typeof info.envdVersion, 'string')
    } finally {
      await kill(sbx)
    }
  })

  it('create with no template starts base, runs as user in /home/user', slow, async () => {
    const sbx = await Sandbox.create({ metadata: tag, timeoutMs: shortTimeoutMs })
    try {
      const info = await sbx.getInfo()
      assert.ok(info.templateId === 'base' || info.name === 'base', `templateId ${info.templateId} / name ${info.name}`)
      const r = await sbx.commands.run('whoami; pwd; echo $HOME')
      assert.equal(r.stdout, 'user\n/home/user\n/home/user\n')
      // E2B's base has python as python3; programs written for it call it.
      assert.match((await sbx.commands.run('python --version')).stdout, /^Python 3\./)
      // ...and its user may sudo without a password (on gVisor, which
      // honours no setuid bit, through the agent: docs/E2B.md).
      assert.equal((await sbx.commands.run('sudo -n id -u')).stdout, '0\n')
      assert.equal((await sbx.commands.run('sudo -n -u nobody id -un')).stdout, 'nobody\n')
      assert.equal((await sbx.commands.run('echo hi | sudo tee /root/by-sudo >/dev/null; sudo cat /root/by-sudo')).stdout, 'hi\n')
      const failed = await sbx.commands.run('sudo sh -c "exit 7"').catch((e) => e)
      assert.equal(failed.exitCode ?? failed.result?.exitCode, 7)
    } finally {
      await kill(sbx)
    }
  })

  it('create without timeoutMs gets a default lifetime', slow, async () => {
    const sbx = await Sandbox.create({ metadata: tag })
    try {
      const info = await sbx.getInfo()
      if (which === 'old') {
        // This SDK sends its own default, 300 seconds, in the request.
        closeTo(info.endAt - info.startedAt, 300_000, 10_000, 'endAt - startedAt')
      } else {
        // e2b 2.51 leaves the default to the server; it must be some time
        // in the future.
        assert.ok(info.endAt > Date.now(), `endAt ${info.endAt.toISOString()} is not in the future`)
      }
    } finally {
      await kill(sbx)
    }
  })

  it('setTimeout extends and shortens the sandbox lifetime', slow, async () => {
    const sbx = await create({ timeoutMs: 60_000 })
    try {
      await sbx.setTimeout(240_000)
      let info = await sbx.getInfo()
      closeTo(info.endAt.getTime(), Date.now() + 240_000, 15_000, 'endAt after setTimeout(240 s)')
      await sbx.setTimeout(30_000)
      info = await sbx.getInfo()
      closeTo(info.endAt.getTime(), Date.now() + 30_000, 15_000, 'endAt after setTimeout(30 s)')
      // The static form does the same for a sandbox known by ID.
      await Sandbox.setTimeout(sbx.sandboxId, 90_000)
      info = await Sandbox.getInfo(sbx.sandboxId)
      closeTo(info.endAt.getTime(), Date.now() + 90_000, 15_000, 'endAt after Sandbox.setTimeout(90 s)')
    } finally {
      await kill(sbx)
    }
  })

  it('a sandbox past its timeout is gone', slow, async () => {
    // Long enough that a loaded machine still sees it running first.
    const sbx = await create({ timeoutMs: 15_000 })
    try {
      assert.equal(await sbx.isRunning(), true)
      await waitFor(
        'the sandbox to end at its timeout',
        async () => {
          try {
            await Sandbox.getInfo(sbx.sandboxId)
            return false
          } catch (err) {
            if (err instanceof SandboxNotFoundError) return true
            throw err
          }
        },
        { timeoutMs: 60_000, intervalMs: 1_000 }
      )
      assert.equal(await sbx.isRunning(), false)
      assert.equal(await sbx.kill(), false)
    } finally {
      await kill(sbx)
    }
  })

  it('isRunning is true until kill, kill is true once and false after', slow, async () => {
    const sbx = await create()
    try {
      assert.equal(await sbx.isRunning(), true)
      assert.equal(await sbx.kill(), true)
      assert.equal(await sbx.isRunning(), false)
      assert.equal(await sbx.kill(), false)
      assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    } finally {
      await kill(sbx)
    }
  })

  it('Sandbox.kill by ID ends a sandbox', slow, async () => {
    const sbx = await create()
    try {
      assert.equal(await Sandbox.kill(sbx.sandboxId), true)
      assert.equal(await sbx.isRunning(), false)
    } finally {
      await kill(sbx)
    }
  })

  it('Sandbox.list filters by metadata and pages with limit', { ...slow, skip: lacks.pagination }, async () => {
    const group = { ...tag, group: `list-${Date.now()}` }
    const sandboxes = await Promise.all([
      create({ metadata: { ...group, n: '1' } }),
      create({ metadata: { ...group, n: '2' } }),
      create({ metadata: { purpose: 'not-in-the-group' } }),
    ])
    try {
      const want = sandboxes.slice(0, 2).map((s) => s.sandboxId).sort()

      // One filter key, then all the group's keys: both find exactly the two.
      for (const metadata of [{ group: group.group }, group]) {
        const pages = Sandbox.list({ query: { metadata }, limit: 1 })
        const seen = []
        const first = await pages.nextItems()
        assert.equal(first.length, 1, `first page of limit 1: ${JSON.stringify(first)}`)
        assert.equal(pages.hasNext, true, 'one of two sandboxes listed, but hasNext is false')
        assert.ok(pages.nextToken, 'hasNext without a nextToken')
        seen.push(...first)
        while (pages.hasNext) {
          const page = await pages.nextItems()
          assert.ok(page.length <= 1, `a page of ${page.length} with limit 1`)
          seen.push(...page)
        }
        assert.deepEqual(seen.map((s) => s.sandboxId).sort(), want, `listed with ${JSON.stringify(metadata)}`)
        for (const s of seen) {
          assert.equal(s.state, 'running')
          assert.equal(s.metadata.group, group.group)
          assert.ok(s.templateId === 'base' || s.name === 'base', `templateId ${s.templateId} / name ${s.name}`)
          assert.ok(s.startedAt instanceof Date && !isNaN(s.startedAt))
          assert.ok(s.endAt instanceof Date && !isNaN(s.endAt))
        }
      }

      // Without a limit, one page has both; a metadata value nobody has
      // lists nothing.
      const all = await Sandbox.list({ query: { metadata: group } }).nextItems()
      assert.deepEqual(all.map((s) => s.sandboxId).sort(), want)
      const none = Sandbox.list({ query: { metadata: { ...tag, group: 'no-such-group' } } })
      assert.deepEqual(await none.nextItems(), [])
      assert.equal(none.hasNext, false)

      // A state filter of running keeps them; of paused drops them.
      const running = await Sandbox.list({ query: { metadata: group, state: ['running'] } }).nextItems()
      assert.equal(running.length, 2)
      const paused = await Sandbox.list({ query: { metadata: group, state: ['paused'] } }).nextItems()
      assert.deepEqual(paused, [])
    } finally {
      await Promise.all(sandboxes.map(kill))
    }
  })

  it('a killed sandbox leaves the list', { ...slow, skip: lacks.pagination }, async () => {
    const sbx = await create({ metadata: { purpose: 'killed-leaves-list' } })
    try {
      const query = { metadata: { ...tag, purpose: 'killed-leaves-list' } }
      assert.equal((await Sandbox.list({ query }).nextItems()).length, 1)
      await sbx.kill()
      assert.deepEqual(await Sandbox.list({ query }).nextItems(), [])
    } finally {
      await kill(sbx)
    }
  })

  it('pause then Sandbox.connect resumes with processes and memory kept', { ...slow, skip: lacks.pause || lacks.connect }, async () => {
    const sbx = await create()
    try {
      // A process that holds a value only in its memory: it prints it, then
      // waits for a line on stdin and prints it again.
      const out = []
      const holder = await sbx.commands.run(
        'v=$(od -An -N8 -tx8 /dev/urandom | tr -d " "); echo "v=$v"; read line; echo "still=$v line=$line"',
        { background: true, stdin: true, onStdout: (d) => out.push(d), timeoutMs: 0 }
      )
      const value = (await waitFor('the value printed before the pause', () => out.join('').match(/v=([0-9a-f]+)/)))[1]
      const sleeper = await sbx.commands.run('sleep 3600', { background: true, timeoutMs: 0 })
      await sbx.files.write('/home/user/before-pause.txt', 'kept on disk')
      await holder.disconnect()
      await sleeper.disconnect()

      assert.equal(await sbx.pause(), true)
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.equal(info.state, 'paused')
      if (!lacks.pagination) {
        const paused = await Sandbox.list({ query: { metadata: tag, state: ['paused'] } }).nextItems()
        assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), 'the paused sandbox is not listed as paused')
      }
      // Pausing a paused sandbox is not an error: pause says false.
      assert.equal(await sbx.pause(), false)

      const resumed = await Sandbox.connect(sbx.sandboxId, { timeoutMs: shortTimeoutMs })
      assert.equal(resumed.sandboxId, sbx.sandboxId)
      assert.equal((await resumed.getInfo()).state, 'running')
      assert.equal(await resumed.isRunning(), true)

      const pids = (await resumed.commands.list()).map((p) => p.pid)
      assert.ok(pids.includes(sleeper.pid), `sleep ${sleeper.pid} is gone after resume: ${pids}`)
      assert.ok(pids.includes(holder.pid), `the value holder ${holder.pid} is gone after resume: ${pids}`)
      assert.equal(await resumed.files.read('/home/user/before-pause.txt'), 'kept on disk')

      const again = await resumed.commands.connect(holder.pid)
      await resumed.commands.sendStdin(holder.pid, 'after-resume\n')
      const r = await again.wait()
      assert.match(r.stdout, new RegExp(`still=${value} line=after-resume`))
    } finally {
      await kill(sbx)
    }
  })

  it('connect with timeoutMs extends a running sandbox, never shortens it', { ...slow, skip: lacks.connect }, async () => {
    const sbx = await create({ timeoutMs: 60_000 })
    try {
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 240_000 })
      let info = await sbx.getInfo()
      closeTo(info.endAt.getTime(), Date.now() + 240_000, 15_000, 'endAt after connect with 240 s')
      // "For running sandboxes, the timeout will update only if the new
      // timeout is longer than the existing one" (SandboxConnectOpts).
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 30_000 })
      info = await sbx.getInfo()
      closeTo(info.endAt.getTime(), Date.now() + 240_000, 15_000, 'endAt after connect with a shorter 30 s')
    } finally {
      await kill(sbx)
    }
  })

  it('connect to a running sandbox returns a usable handle', { ...slow, skip: lacks.connect }, async () => {
    const sbx = await create()
    try {
      await sbx.files.write('/home/user/marker.txt', 'here')
      const same = await Sandbox.connect(sbx.sandboxId)
      assert.equal(same.sandboxId, sbx.sandboxId)
      assert.equal(await same.files.read('/home/user/marker.txt'), 'here')
      assert.equal((await same.commands.run('echo connected')).stdout, 'connected\n')
    } finally {
      await kill(sbx)
    }
  })

  it('a sandbox killed while a command streams ends the command with the SDK\'s "killed" TimeoutError', slow, async () => {
    const sbx = await create()
    try {
      const started = []
      const run = sbx.commands.run('echo started; sleep 60', { onStdout: (d) => started.push(d) })
      run.catch(() => {}) // judged below
      await waitFor(() => 'the command to start', () => started.join('').includes('started'))
      await Sandbox.kill(sbx.sandboxId)
      await assert.rejects(run, (err) => {
        assert.ok(err instanceof TimeoutError, `${err?.name}: ${err?.message}`)
        assert.match(err.message, /The sandbox was killed or reached its end of life/)
        return true
      })
    } finally {
      await kill(sbx)
    }
  })
})

// Printed once so a log says which SDK ran.
console.log(`e2b@${sdkVersion} against ${process.env.E2B_API_URL}`)
