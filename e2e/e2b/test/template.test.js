// E2B's Template API through the SDK, unchanged: Template.build and
// buildInBackground from an image with runCmd, setEnvs, setWorkdir, setUser
// and a start command with a ready check; the build's logs; getBuildStatus
// with logsOffset; exists; tags (several per build, assignTags, removeTags,
// getTags); a rebuild of a name:tag; a failing step as BuildError; then
// Sandbox.create from the template, its commands and its server.
//
// TestE2BSDKTemplate (e2e/templates_e2b_sdk_test.go) runs this file with an
// in-process registry: E2B_TEMPLATE_IMAGE is the base image (the busybox test
// root filesystem, whose /bin/bash is busybox's sh), E2B_TEMPLATE_PRIVATE_IMAGE
// the same behind basic authentication (E2B_TEMPLATE_REGISTRY_USER/_PASS).
// Without them (TestE2BSDK's run of every file) the file skips.
import { describe, test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { mkdtempSync, writeFileSync, mkdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

import { e2b, Sandbox, sdkVersion, title, slow, tag, kill, cleanup, which, apiKey, shortTimeoutMs, waitFor } from '../lib/sdk.js'

const { Template, BuildError, waitForPort } = e2b
const image = process.env.E2B_TEMPLATE_IMAGE
const skip = !image
  ? 'E2B_TEMPLATE_IMAGE is not set (TestE2BSDKTemplate runs this file)'
  : typeof Template !== 'function'
    ? `e2b@${sdkVersion} has no Template`
    : false

// Names of this run: both SDK versions build on one server and account.
const name = `app-${which}`
const long = { timeout: 600_000 }

// notYet turns a server's 400 "… not supported yet" into a skip naming the
// feature, so that a server without one of these features says so instead
// of failing; E2B_TEMPLATE_REQUIRE_ALL=1 (TestE2BSDKTemplate's) fails
// instead, as sandboxd has them all.
async function notYet(t, feature, fn) {
  try {
    return await fn()
  } catch (err) {
    if (/not supported yet/.test(String(err?.message)) && process.env.E2B_TEMPLATE_REQUIRE_ALL !== '1') {
      t.skip(`${feature}: the server says ${err.message}`)
      return undefined
    }
    throw err
  }
}

// lineHere is the line of the caller in this file: where the SDK's
// collected stack trace of a step should point.
function lineHere() {
  const frame = new Error().stack.split('\n')[2]
  return Number(frame.match(/template\.test\.js:(\d+):/)[1])
}

// api calls the server's E2B API with this run's key, for what the SDK
// reads but does not hand back (the log entries' step).
async function api(pathAndQuery) {
  const res = await fetch(new URL(pathAndQuery, process.env.E2B_API_URL), { headers: { 'X-API-KEY': apiKey } })
  assert.equal(res.status, 200, `GET ${pathAndQuery}: ${res.status}`)
  return res.json()
}

// getPort fetches / from port of sbx through the E2B host sbx.getHost(port)
// names, on the server's one listener.
function getPort(sbx, port) {
  const base = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: base.hostname, port: base.port, path: '/', headers: { Host: sbx.getHost(port) } },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (c) => (body += c))
        res.on('end', () => resolve({ status: res.statusCode, body }))
      }
    )
    req.on('error', reject)
    req.end()
  })
}

// createFrom starts a sandbox of template with a network (sandboxd's
// default is none), so that its ports can be reached.
async function createFrom(template) {
  return Sandbox.create(template, { timeoutMs: shortTimeoutMs, metadata: tag, allowInternetAccess: true })
}

// app is the template most cases use: a user made by a RUN, a page served
// by its start command, ENV, WORKDIR and USER.
function app(page) {
  return Template()
    .fromImage(image)
    .runCmd('echo "app:x:1000:1000::/home/app:/bin/sh" >> /etc/passwd && mkdir -p /home/app /srv/www && chown 1000:1000 /home/app')
    .runCmd(`echo ${page} > /srv/www/index.html`, { user: 'root' })
    .setEnvs({ GREETING: 'hello', APP_MODE: 'e2e' })
    .setWorkdir('/home/app/work')
    .setUser('app')
    .setStartCmd('busybox httpd -f -p 8000 -h /srv/www', waitForPort(8000))
}

describe(title('template'), { skip }, () => {
  after(cleanup)
  let built
  let firstSandbox

  test('Template.build with steps, a start command and two tags, its logs', long, async () => {
    assert.equal(await Template.exists(name), false)
    const logs = []
    built = await Template.build(app('page-one'), `${name}:v1`, {
      tags: ['stable'],
      onBuildLogs: (entry) => logs.push(entry),
    })
    assert.equal(built.templateId, name)
    assert.ok(built.buildId, 'a build id')
    assert.deepEqual([...built.tags].sort(), ['stable', 'v1'])
    const text = logs.map((e) => e.message).join('\n')
    for (const want of ['Build started', 'RUN echo page-one', 'WORKDIR /home/app/work', 'USER app', 'finalize', 'ready']) {
      assert.ok(text.includes(want), `the logs have ${JSON.stringify(want)}:\n${text}`)
    }
    assert.ok(logs.every((e) => e.timestamp instanceof Date && !Number.isNaN(e.timestamp.getTime())))

    // The wire's entries carry the step each line belongs to: the base,
    // the steps (1-based), finalize.
    const st = await api(`/templates/${built.templateId}/builds/${built.buildId}/status?logsOffset=0`)
    assert.equal(st.status, 'ready')
    const steps = new Set(st.logEntries.map((e) => e.step))
    for (const want of ['base', '1', '2', '3', '4', '5', 'finalize']) {
      assert.ok(steps.has(want), `a log entry of step ${want}: ${JSON.stringify(st.logEntries.map((e) => [e.step, e.message]))}`)
    }
    const run2 = st.logEntries.find((e) => e.message.includes('RUN echo page-one'))
    assert.equal(run2.step, '2')
  })

  test('Template.exists: the name and name:tag, not another name', slow, async () => {
    assert.ok(built, 'built')
    assert.equal(await Template.exists(name), true)
    assert.equal(await Template.exists(`${name}:stable`), true)
    assert.equal(await Template.exists(`${name}-nothing`), false)
    assert.equal(await Template.exists(`${name}:nothing`), false)
  })

  test('Sandbox.create(name:tag): ENV, WORKDIR, USER, and the start command serves at once', slow, async () => {
    assert.ok(built, 'built')
    firstSandbox = await createFrom(`${name}:v1`)
    // The server answers right after create: the ready check passed first.
    const page = await getPort(firstSandbox, 8000)
    assert.deepEqual(page, { status: 200, body: 'page-one\n' })
    const r = await firstSandbox.commands.run('echo "$GREETING $APP_MODE"; pwd; id -un')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello e2e\n/home/app/work\napp\n')
    // The other tag starts the same build.
    const other = await createFrom(`${name}:stable`)
    try {
      assert.equal((await other.commands.run('cat /srv/www/index.html')).stdout, 'page-one\n')
    } finally {
      await kill(other)
    }
  })

  test('getTags, assignTags, removeTags', slow, async () => {
    assert.ok(built, 'built')
    const tagsOf = async () => Object.fromEntries((await Template.getTags(name)).map((t) => [t.tag, t]))
    let tags = await tagsOf()
    assert.deepEqual(Object.keys(tags).sort(), ['stable', 'v1'])
    assert.equal(tags.v1.buildId, built.buildId)
    assert.equal(tags.stable.buildId, built.buildId)
    assert.ok(tags.v1.createdAt instanceof Date && !Number.isNaN(tags.v1.createdAt.getTime()))

    const assigned = await Template.assignTags(`${name}:v1`, ['prod', 'blue'])
    assert.equal(assigned.buildId, built.buildId)
    assert.deepEqual([...assigned.tags].sort(), ['blue', 'prod'])
    tags = await tagsOf()
    assert.deepEqual(Object.keys(tags).sort(), ['blue', 'prod', 'stable', 'v1'])
    assert.equal(tags.prod.buildId, built.buildId)
    assert.equal(await Template.exists(`${name}:prod`), true)
    const sbx = await createFrom(`${name}:prod`)
    try {
      assert.equal((await getPort(sbx, 8000)).body, 'page-one\n')
    } finally {
      await kill(sbx)
    }

    await Template.removeTags(name, ['prod', 'blue'])
    tags = await tagsOf()
    assert.deepEqual(Object.keys(tags).sort(), ['stable', 'v1'])
    assert.equal(await Template.exists(`${name}:prod`), false)
    await assert.rejects(Template.removeTags(name, 'prod'), (err) => /prod/.test(err.message))
    await assert.rejects(Template.assignTags(`${name}:nothing`, 'x'), (err) => /not found/i.test(err.message))
  })

  test('a rebuild of name:tag takes the tag when ready; a sandbox of the old build runs on', long, async () => {
    assert.ok(firstSandbox, 'a sandbox of the first build')
    const again = await Template.build(app('page-two'), `${name}:v1`)
    assert.notEqual(again.buildId, built.buildId)
    const tags = Object.fromEntries((await Template.getTags(name)).map((t) => [t.tag, t]))
    assert.equal(tags.v1.buildId, again.buildId)
    assert.equal(tags.stable.buildId, built.buildId, 'stable stays on the first build')
    const sbx = await createFrom(`${name}:v1`)
    try {
      assert.equal((await getPort(sbx, 8000)).body, 'page-two\n')
    } finally {
      await kill(sbx)
    }
    // The sandbox of the first build is untouched.
    assert.equal((await getPort(firstSandbox, 8000)).body, 'page-one\n')
    assert.equal((await firstSandbox.commands.run('cat /srv/www/index.html')).stdout, 'page-one\n')
    await kill(firstSandbox)
  })

  test('buildInBackground and getBuildStatus with logsOffset', long, async () => {
    const data = await Template.buildInBackground(
      Template().fromImage(image).runCmd('echo background > /bg.txt'),
      { alias: `${name}-bg` }
    )
    assert.equal(data.templateId, `${name}-bg`)
    let offset = 0
    const messages = []
    const status = await waitFor(
      () => `the background build (${messages.join(' | ')})`,
      async () => {
        const st = await Template.getBuildStatus(data, { logsOffset: offset })
        offset += st.logEntries.length
        messages.push(...st.logEntries.map((e) => e.message))
        assert.notEqual(st.status, 'error', st.reason?.message)
        return st.status === 'ready' && st
      },
      { timeoutMs: 300_000, intervalMs: 300 }
    )
    assert.equal(status.buildID ?? status.buildId, data.buildId)
    assert.ok(messages.some((m) => m.includes('RUN echo background')), messages.join('\n'))
    // Nothing new past the end; the offset counts entries.
    const tail = await Template.getBuildStatus(data, { logsOffset: offset })
    assert.deepEqual(tail.logEntries, [])
    const second = await Template.getBuildStatus(data, { logsOffset: 1 })
    assert.equal(second.logEntries[0].message, messages[1])
    const sbx = await createFrom(`${name}-bg`)
    try {
      assert.equal((await sbx.commands.run('cat /bg.txt')).stdout, 'background\n')
    } finally {
      await kill(sbx)
    }
  })

  test('a failing RUN is a BuildError naming the step, pointing at its line', long, async () => {
    const tpl = Template().fromImage(image).runCmd('true')
    const line = lineHere(); tpl.runCmd('echo failing-step; exit 3')
    const logs = []
    await assert.rejects(
      Template.build(tpl, `${name}-bad:v1`, { onBuildLogs: (e) => logs.push(e.message) }),
      (err) => {
        assert.ok(err instanceof BuildError, `a BuildError: ${err}`)
        assert.match(err.message, /step 2 \(RUN echo failing-step; exit 3\) failed with exit code 3/)
        // reason.step is "2": the SDK's stack is the second step's call.
        assert.ok(err.stack.includes(`template.test.js:${line}:`), `the stack points at line ${line}: ${err.stack}`)
        return true
      }
    )
    assert.ok(logs.some((m) => m.includes('failing-step')), logs.join('\n'))
    const st = await api(`/templates/${name}-bad/builds/v1/status`)
    assert.equal(st.status, 'error')
    assert.equal(st.reason.step, '2')
  })

  test('an image that is not there is a BuildError at the base, pointing at fromImage', long, async () => {
    const missing = image.replace(/:v1$/, ':missing')
    assert.notEqual(missing, image)
    const line = lineHere(); const tpl = Template().fromImage(missing)
    tpl.runCmd('true')
    await assert.rejects(Template.build(tpl, `${name}-noimage`), (err) => {
      assert.ok(err instanceof BuildError, `a BuildError: ${err}`)
      assert.ok(err.stack.includes(`template.test.js:${line}:`), `the stack points at line ${line}: ${err.stack}`)
      return true
    })
    const st = await api(`/templates/${name}-noimage/builds/latest/status`)
    assert.equal(st.status, 'error')
    assert.equal(st.reason.step, 'base')
    assert.ok(st.logEntries.every((e) => e.step === 'base'), JSON.stringify(st.logEntries))
  })

  test('cpuCount and memoryMB over the server\'s limits are refused by name', slow, async () => {
    await assert.rejects(
      Template.build(Template().fromImage(image).runCmd('true'), `${name}-big`, { cpuCount: 4096 }),
      (err) => /cpuCount/.test(err.message)
    )
    await assert.rejects(
      Template.build(Template().fromImage(image).runCmd('true'), `${name}-big`, { memoryMB: 1 << 30 }),
      (err) => /memoryMB/.test(err.message)
    )
  })

  test('copy() uploads files the build copies in', long, async (t) => {
    const dir = mkdtempSync(path.join(tmpdir(), 'e2b-copy-'))
    mkdirSync(path.join(dir, 'site'))
    writeFileSync(path.join(dir, 'site', 'hello.txt'), 'copied by the sdk\n')
    const tpl = Template({ fileContextPath: dir }).fromImage(image).copy('site/hello.txt', '/opt/site/')
    const done = await notYet(t, 'COPY (file uploads)', () => Template.build(tpl, `${name}-copy`))
    if (!done) return
    const sbx = await createFrom(`${name}-copy`)
    try {
      assert.equal((await sbx.commands.run('cat /opt/site/hello.txt')).stdout, 'copied by the sdk\n')
    } finally {
      await kill(sbx)
    }
  })

  test('fromTemplate() builds over another template', long, async (t) => {
    const tpl = Template().fromTemplate(`${name}-bg`).runCmd('echo over > /over.txt', { user: 'root' })
    const done = await notYet(t, 'fromTemplate', () => Template.build(tpl, `${name}-over`))
    if (!done) return
    const sbx = await createFrom(`${name}-over`)
    try {
      assert.equal((await sbx.commands.run('cat /bg.txt /over.txt')).stdout, 'background\nover\n')
    } finally {
      await kill(sbx)
    }
  })

  test('fromImage(ref, {username, password}) pulls from a registry that demands them', long, async (t) => {
    const ref = process.env.E2B_TEMPLATE_PRIVATE_IMAGE
    if (!ref) return t.skip('E2B_TEMPLATE_PRIVATE_IMAGE is not set')
    const username = process.env.E2B_TEMPLATE_REGISTRY_USER
    const password = process.env.E2B_TEMPLATE_REGISTRY_PASS
    const done = await notYet(t, 'registry credentials', () =>
      Template.build(Template().fromImage(ref, { username, password }).runCmd('echo private > /p.txt'), `${name}-private`)
    )
    if (!done) return
    const sbx = await createFrom(`${name}-private`)
    try {
      assert.equal((await sbx.commands.run('cat /p.txt')).stdout, 'private\n')
    } finally {
      await kill(sbx)
    }
    // A wrong password fails the build (the registry refuses it).
    await assert.rejects(
      Template.build(Template().fromImage(ref, { username, password: 'wrong' }), `${name}-private-bad`),
      (err) => err instanceof BuildError && !err.message.includes(password)
    )
  })
})
