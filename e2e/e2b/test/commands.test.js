// sandbox.commands: run in the foreground and the background, exit codes
// and CommandExitError, kill, connect to a running command by pid, stdin.
// One sandbox serves the whole file.
import { after, beforeEach, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import {
  CommandExitError,
  NotFoundError,
  SandboxError,
  cleanup,
  shared,
  slow,
  title,
  waitFor,
} from '../lib/sdk.js'

describe(title('commands'), () => {
  const box = shared()
  let sbx
  beforeEach(async () => {
    sbx = await box.get()
  })
  after(async () => {
    await box.done()
    await cleanup()
  })

  it('run returns stdout, stderr and exit code 0', slow, async () => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')
  })

  it('a non-zero exit throws CommandExitError carrying the result', slow, async () => {
    const err = await sbx.commands.run('echo partial; echo oops >&2; exit 3').then(
      () => assert.fail('exit 3 did not throw'),
      (e) => e
    )
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.ok(err instanceof SandboxError)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'partial\n')
    assert.equal(err.stderr, 'oops\n')
  })

  it('an unknown command exits 127', slow, async () => {
    const err = await sbx.commands.run('no-such-command-e2e').catch((e) => e)
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.equal(err.exitCode, 127)
    assert.match(err.stderr, /not found/)
  })

  it('onStdout and onStderr receive the output as it comes', slow, async () => {
    const out = []
    const errs = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; echo e$i >&2; sleep 0.1; done', {
      onStdout: (d) => out.push(d),
      onStderr: (d) => errs.push(d),
    })
    assert.equal(out.join(''), 'line1\nline2\nline3\n')
    assert.equal(errs.join(''), 'e1\ne2\ne3\n')
    assert.equal(r.stdout, out.join(''))
  })

  it('cwd, envs and user apply to the command', slow, async () => {
    assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('echo "$FOO-$BAR"', { envs: { FOO: 'foo', BAR: 'b a r' } })).stdout, 'foo-b a r\n')
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    assert.equal((await sbx.commands.run('whoami; pwd', { user: 'root' })).stdout, 'root\n/root\n')
    // Commands run in a login bash (the SDK starts /bin/bash -l -c).
    assert.match((await sbx.commands.run('echo $0; shopt -q login_shell && echo login')).stdout, /bash\nlogin\n/)
  })

  it('large output arrives whole', slow, async () => {
    const r = await sbx.commands.run('head -c 1000000 /dev/zero | tr "\\0" x')
    assert.equal(r.stdout.length, 1_000_000)
    assert.ok(/^x+$/.test(r.stdout))
  })

  it('background: true returns a handle; list shows it; kill ends it', slow, async () => {
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.ok(Number.isInteger(h.pid) && h.pid > 0, `pid ${h.pid}`)
    const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid)
    assert.ok(listed, `pid ${h.pid} not in commands.list()`)
    assert.equal(listed.cmd, '/bin/bash')
    assert.deepEqual(listed.args, ['-l', '-c', 'sleep 600'])

    assert.equal(await h.kill(), true)
    const err = await h.wait().then(
      () => assert.fail('a killed command did not throw'),
      (e) => e
    )
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.notEqual(err.exitCode, 0)
    await waitFor('the killed command to leave the list', async () =>
      !(await sbx.commands.list()).some((p) => p.pid === h.pid)
    )
    // Killing what is gone says false.
    assert.equal(await sbx.commands.kill(h.pid), false)
  })

  it('commands.kill by pid ends a background command', slow, async () => {
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.commands.kill(h.pid), true)
    const err = await h.wait().catch((e) => e)
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
  })

  it('a background command finishes on its own and wait returns its result', slow, async () => {
    const h = await sbx.commands.run('sleep 0.5; echo done', { background: true })
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'done\n')
    assert.equal(h.exitCode, 0)
  })

  it('connect to a running command by pid follows it to the end', slow, async () => {
    const flag = `/tmp/go-${Date.now()}`
    const h = await sbx.commands.run(`echo started; while [ ! -e ${flag} ]; do sleep 0.1; done; echo after-connect; exit 7`, {
      background: true,
      timeoutMs: 0,
    })
    await waitFor('the command to start', () => h.stdout.includes('started'))
    await h.disconnect()

    const seen = []
    const again = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
    assert.equal(again.pid, h.pid)
    await sbx.commands.run(`touch ${flag}`)
    const err = await again.wait().catch((e) => e)
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.equal(err.exitCode, 7)
    assert.match(err.stdout, /after-connect/)
    assert.match(seen.join(''), /after-connect/)
  })

  it('connect to a pid that does not exist throws NotFoundError', slow, async () => {
    await assert.rejects(sbx.commands.connect(999_999), (e) => e instanceof NotFoundError)
  })

  it('sendStdin feeds a command started with stdin: true', slow, async () => {
    const h = await sbx.commands.run('read a; read b; echo "got:$a,$b"', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'one\n')
    await h.sendStdin('two\n')
    const r = await h.wait()
    assert.equal(r.stdout, 'got:one,two\n')
  })

  it('closeStdin ends the input of a command', slow, async () => {
    const h = await sbx.commands.run('cat; echo "[eof]"', { background: true, stdin: true })
    await h.sendStdin('abc')
    await h.sendStdin(new TextEncoder().encode('-def'))
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.stdout, 'abc-def[eof]\n')
  })

  it('without stdin: true a command reads end of file at once', slow, async () => {
    const r = await sbx.commands.run('cat; echo "[eof]"', { timeoutMs: 20_000 })
    assert.equal(r.stdout, '[eof]\n')
  })
})
