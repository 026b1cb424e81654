// E2B's code-interpreter SDK (@e2b/code-interpreter), unchanged, against a
// sandboxd server started with --template code-interpreter: Sandbox.create()
// asks for the template code-interpreter-v1, runCode goes to port 49999
// (E2b-Sandbox-Port, on E2B_SANDBOX_URL), which sandboxd serves from the
// sandbox's agent. Run by TestE2BCodeInterpreter (e2e/code_test.go).
import { test, describe, after } from 'node:test'
import assert from 'node:assert/strict'
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'

import { tag, shortTimeoutMs, slow } from '../lib/sdk.js'

const require = createRequire(import.meta.url)
const version = JSON.parse(readFileSync(require.resolve('@e2b/code-interpreter/package.json'), 'utf8')).version
// TimeoutError is the code-interpreter SDK's own e2b's (its dependency).
const { Sandbox, TimeoutError } = await import('@e2b/code-interpreter')

// One sandbox for the file: a kernel keeps its state between the tests,
// which is what they check.
let made
// Its envs are every kernel's environment, as E2B's server reads them
// from envd.
const sandbox = () => (made ??= Sandbox.create({ timeoutMs: shortTimeoutMs * 2, metadata: tag, envs: { SANDBOX_WIDE: 'yes' } }))
after(async () => {
  if (made) await (await made).kill().catch(() => {})
})

describe(`code interpreter (@e2b/code-interpreter@${version})`, () => {
  test('keeps state between cells, streams stdout, returns the last value', slow, async () => {
    const sbx = await sandbox()
    assert.equal((await sbx.runCode('x = 41')).error, undefined)
    const seen = []
    const started = Date.now()
    const exec = await sbx.runCode('import time\nfor i in range(3):\n    print("line", i, flush=True)\n    time.sleep(0.4)\nx + 1', {
      onStdout: (m) => seen.push({ line: m.line, at: Date.now() }),
    })
    assert.equal(exec.text, '42')
    assert.deepEqual(exec.logs.stdout, ['line 0\n', 'line 1\n', 'line 2\n'])
    assert.deepEqual(seen.map((s) => s.line), exec.logs.stdout)
    // Streamed as printed: the first line came well before the cell ended.
    assert.ok(seen[2].at - seen[0].at >= 500, `lines arrived ${seen[0].at - started} and ${seen[2].at - started} ms after the start`)
    assert.ok(exec.executionCount >= 2)
  })

  test('returns a matplotlib chart as PNG with its chart data', slow, async () => {
    const sbx = await sandbox()
    const results = []
    const exec = await sbx.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 8], label='growth')\nplt.title('Growth')\nplt.show()",
      { onResult: (r) => results.push(r) }
    )
    assert.equal(exec.error, undefined)
    assert.equal(exec.results.length, 1)
    const r = exec.results[0]
    assert.equal(results.length, 1)
    assert.ok(r.png.startsWith('iVBORw0KGgo'), 'a base64 PNG')
    assert.ok(Buffer.from(r.png, 'base64').length > 1000)
    assert.equal(r.isMainResult, false)
    assert.ok(r.formats().includes('png'))
    assert.equal(r.chart.type, 'line')
    assert.equal(r.chart.title, 'Growth')
    assert.deepEqual(r.chart.elements[0].points, [[1, 2], [2, 4], [3, 8]])
  })

  test('returns a DataFrame as HTML and data', slow, async () => {
    const sbx = await sandbox()
    const exec = await sbx.runCode("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3.5, 19.0]})")
    assert.equal(exec.error, undefined)
    const r = exec.results[0]
    assert.equal(r.isMainResult, true)
    assert.match(r.html, /<table[\s\S]*Oslo[\s\S]*Lima/)
    assert.deepEqual(r.data, { city: ['Oslo', 'Lima'], temp: [3.5, 19.0] })
    assert.match(r.text, /Oslo/)
  })

  test('reports an exception with its traceback', slow, async () => {
    const sbx = await sandbox()
    const errors = []
    const exec = await sbx.runCode('def f():\n    return {}["missing"]\nf()', { onError: (e) => errors.push(e) })
    assert.equal(exec.error.name, 'KeyError')
    assert.equal(exec.error.value, "'missing'")
    assert.match(exec.error.traceback, /return \{\}\["missing"\]/)
    assert.equal(errors.length, 1)
    // The context is usable after it.
    assert.equal((await sbx.runCode('x')).text, '41')
  })

  test('a timeout interrupts the cell and leaves the context usable', slow, async () => {
    const sbx = await sandbox()
    await sbx.runCode('kept = "still here"')
    await assert.rejects(sbx.runCode('import time\ntime.sleep(120)', { timeoutMs: 2000 }), TimeoutError)
    // The client's abort reached the server, which interrupted the kernel:
    // the next cell runs at once, with the state before the timeout.
    const started = Date.now()
    const exec = await sbx.runCode('kept', { timeoutMs: 30_000 })
    assert.equal(exec.text, 'still here')
    assert.ok(Date.now() - started < 20_000, `the next cell took ${Date.now() - started} ms`)
  })

  test('envs are for one execution only', slow, async () => {
    const sbx = await sandbox()
    const exec = await sbx.runCode('import os\nprint(os.environ["GREETING"])', { envs: { GREETING: "it's \"quoted\"" } })
    assert.deepEqual(exec.logs.stdout, [`it's "quoted"\n`])
    const after = await sbx.runCode('import os\nos.environ.get("GREETING", "unset")')
    assert.equal(after.text, 'unset')
    assert.equal((await sbx.runCode('import os\nos.environ["SANDBOX_WIDE"]')).text, 'yes')
  })

  test('contexts: create, use, list, restart, remove, in two languages', slow, async () => {
    const sbx = await sandbox()
    const py = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.equal(py.language, 'python')
    assert.equal(py.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os\nos.getcwd()', { context: py })).text, '/tmp')
    await sbx.runCode('only_here = 1', { context: py })
    // The default context does not see another's state.
    assert.equal((await sbx.runCode('only_here')).error.name, 'NameError')

    const r = await sbx.createCodeContext({ language: 'r' })
    assert.equal(r.language, 'r')
    const rx = await sbx.runCode('v <- c(1, 2, 3)\nsum(v * 2)', { context: r })
    // IRkernel shows a value as a display, not as the cell's result.
    assert.equal(rx.error, undefined)
    assert.equal(rx.results[0].text, '[1] 12')

    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(ids.includes(py.id) && ids.includes(r.id), `listed ${ids}`)

    await sbx.restartCodeContext(py)
    assert.equal((await sbx.runCode('only_here', { context: py })).error.name, 'NameError')

    await sbx.removeCodeContext(r.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === r.id))
    await assert.rejects(sbx.runCode('1', { context: r }), /not found/)
  })
})
