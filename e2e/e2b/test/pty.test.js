// sandbox.pty: an interactive bash on a terminal; input, output, resize,
// reconnect, exit and kill. One sandbox serves the whole file.
import { after, beforeEach, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import { CommandExitError, cleanup, shared, slow, title, waitFor } from '../lib/sdk.js'

const encode = (s) => new TextEncoder().encode(s)

// terminal collects a pty's output as text.
function terminal() {
  const decoder = new TextDecoder()
  const t = {
    text: '',
    onData: (d) => {
      t.text += decoder.decode(d, { stream: true })
    },
    // until waits for a pattern in what came after mark.
    until: (pattern, mark = 0) =>
      waitFor(() => `${pattern} on the terminal; it shows:\n${t.text.slice(mark)}`, () => pattern.test(t.text.slice(mark))),
  }
  return t
}

describe(title('pty'), () => {
  const box = shared()
  let sbx
  beforeEach(async () => {
    sbx = await box.get()
  })
  after(async () => {
    await box.done()
    await cleanup()
  })

  it('pty.create runs an interactive shell: input in, output out, kill', slow, async () => {
    const term = terminal()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData, timeoutMs: 0 })
    assert.ok(h.pid > 0)
    // The arithmetic is done by the shell, so the answer is not an echo of
    // the input.
    await sbx.pty.sendInput(h.pid, encode('echo pty-$((6*7))\n'))
    await term.until(/pty-42/)
    const mark = term.text.length
    await sbx.pty.sendInput(h.pid, encode('tty; echo "term=$TERM"; stty size; echo "who=$(whoami)"\n'))
    await term.until(/\/dev\/pts\/\d+[\s\S]*term=xterm-256color[\s\S]*24 80[\s\S]*who=user/, mark)

    assert.equal(await sbx.pty.kill(h.pid), true)
    const err = await h.wait().then(
      () => assert.fail('a killed pty did not throw'),
      (e) => e
    )
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.equal(await sbx.pty.kill(h.pid), false)
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid), 'the killed pty is still listed')
  })

  it('resize changes the terminal size the shell sees', slow, async () => {
    const term = terminal()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData, timeoutMs: 0 })
    try {
      await sbx.pty.resize(h.pid, { cols: 120, rows: 40 })
      const mark = term.text.length
      await sbx.pty.sendInput(h.pid, encode('stty size\n'))
      await term.until(/40 120/, mark)
    } finally {
      await sbx.pty.kill(h.pid).catch(() => {})
    }
  })

  it('exit in the shell ends the pty with its exit code', slow, async () => {
    const term = terminal()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData, timeoutMs: 0 })
    await sbx.pty.sendInput(h.pid, encode('exit 5\n'))
    const err = await h.wait().catch((e) => e)
    assert.ok(err instanceof CommandExitError, `got ${err?.stack ?? err}`)
    assert.equal(err.exitCode, 5)
  })

  it('cwd, envs and user apply to the pty', slow, async () => {
    const term = terminal()
    const h = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: term.onData,
      cwd: '/tmp',
      envs: { PTY_VAR: 'from-envs' },
      user: 'root',
      timeoutMs: 0,
    })
    try {
      await sbx.pty.sendInput(h.pid, encode('echo "at=$(pwd) var=$PTY_VAR who=$(whoami)"\n'))
      await term.until(/at=\/tmp var=from-envs who=root/)
    } finally {
      await sbx.pty.kill(h.pid).catch(() => {})
    }
  })

  it('pty.connect reattaches to a running pty by pid', slow, async () => {
    const first = terminal()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: first.onData, timeoutMs: 0 })
    try {
      await sbx.pty.sendInput(h.pid, encode('x=kept-$((2+3))\n'))
      await h.disconnect()

      const second = terminal()
      const again = await sbx.pty.connect(h.pid, { onData: second.onData, timeoutMs: 0 })
      assert.equal(again.pid, h.pid)
      await sbx.pty.sendInput(h.pid, encode('echo "var is $x"\n'))
      await second.until(/var is kept-5/)
      await sbx.pty.sendInput(h.pid, encode('exit 0\n'))
      const r = await again.wait()
      assert.equal(r.exitCode, 0)
    } finally {
      await sbx.pty.kill(h.pid).catch(() => {})
    }
  })
})
