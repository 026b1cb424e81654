// sandbox.files: write, read (every format), list, exists, getInfo, makeDir,
// rename, remove, watchDir; and the signed upload and download URLs, used
// with a plain fetch and no key. One sandbox serves the whole file.
import { after, beforeEach, describe, it } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'

import {
  FileNotFoundError,
  FileType,
  FilesystemEventType,
  cleanup,
  shared,
  sameText,
  slow,
  title,
  waitFor,
} from '../lib/sdk.js'

const home = '/home/user'

// bytes0to255 is every byte value, n times over: a binary file that a text
// path would mangle.
function bytes0to255(n = 4) {
  const b = new Uint8Array(256 * n)
  for (let i = 0; i < b.length; i++) b[i] = i % 256
  return b
}

async function readAll(stream) {
  const chunks = []
  for await (const c of stream) chunks.push(c)
  return Buffer.concat(chunks)
}

describe(title('files'), () => {
  const box = shared()
  let sbx
  beforeEach(async () => {
    sbx = await box.get()
  })
  after(async () => {
    await box.done()
    await cleanup()
  })

  it('write then read a text file', slow, async () => {
    const info = await sbx.files.write(`${home}/hello.txt`, 'hello, sandbox\n')
    assert.equal(info.name, 'hello.txt')
    assert.equal(info.path, `${home}/hello.txt`)
    assert.equal(info.type, FileType.FILE)
    assert.equal(await sbx.files.read(`${home}/hello.txt`), 'hello, sandbox\n')
    // The file is there for commands too, owned by the default user.
    assert.equal((await sbx.commands.run(`cat ${home}/hello.txt; stat -c %U ${home}/hello.txt`)).stdout, 'hello, sandbox\nuser\n')
  })

  it('a relative path is relative to the home directory', slow, async () => {
    const info = await sbx.files.write('relative.txt', 'rel')
    assert.equal(info.path, `${home}/relative.txt`)
    assert.equal(await sbx.files.read('relative.txt'), 'rel')
    assert.equal(await sbx.files.read(`${home}/relative.txt`), 'rel')
  })

  it('write creates missing parent directories and overwrites', slow, async () => {
    const path = `${home}/deep/a/b/c.txt`
    await sbx.files.write(path, 'first version, longer')
    await sbx.files.write(path, 'second')
    assert.equal(await sbx.files.read(path), 'second')
    assert.equal((await sbx.files.getInfo(`${home}/deep/a`)).type, FileType.DIR)
  })

  it('an empty file reads back empty', slow, async () => {
    await sbx.files.write(`${home}/empty.txt`, '')
    assert.equal(await sbx.files.read(`${home}/empty.txt`), '')
    assert.equal((await sbx.files.read(`${home}/empty.txt`, { format: 'bytes' })).length, 0)
  })

  it('binary data round-trips through bytes, blob and stream reads', slow, async () => {
    const want = bytes0to255(64)
    const path = `${home}/binary.bin`
    await sbx.files.write(path, want.buffer)
    assert.deepEqual(Buffer.from(await sbx.files.read(path, { format: 'bytes' })), Buffer.from(want))
    const blob = await sbx.files.read(path, { format: 'blob' })
    assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(want))
    assert.deepEqual(await readAll(await sbx.files.read(path, { format: 'stream' })), Buffer.from(want))
    assert.equal((await sbx.commands.run(`sha256sum < ${path}`)).stdout.split(' ')[0], createHash('sha256').update(want).digest('hex'))
    // A Blob goes up as well as an ArrayBuffer.
    await sbx.files.write(`${home}/blob.bin`, new Blob([want]))
    assert.deepEqual(Buffer.from(await sbx.files.read(`${home}/blob.bin`, { format: 'bytes' })), Buffer.from(want))
  })

  it('a 4 MiB file round-trips', slow, async () => {
    const want = bytes0to255(16 * 1024)
    await sbx.files.write(`${home}/big.bin`, want.buffer)
    const got = await sbx.files.read(`${home}/big.bin`, { format: 'bytes' })
    assert.equal(got.length, want.length)
    assert.ok(Buffer.from(got).equals(Buffer.from(want)), 'the 4 MiB file came back different')
  })

  const compressible = 'compressible '.repeat(1000)

  it('octet-stream and streamed uploads', slow, async () => {
    await sbx.files.write(`${home}/octet.txt`, compressible, { useOctetStream: true })
    sameText(await sbx.files.read(`${home}/octet.txt`), compressible, 'an octet-stream upload read back')
    const stream = new Blob(['streamed ', 'body']).stream()
    await sbx.files.write(`${home}/stream.txt`, stream)
    assert.equal(await sbx.files.read(`${home}/stream.txt`), 'streamed body')
  })

  it('a gzip upload is stored uncompressed', slow, async () => {
    // gzip: true sends the body gzipped with Content-Encoding: gzip; the
    // file holds the text, not the gzip stream.
    await sbx.files.write(`${home}/gzip.txt`, compressible, { gzip: true })
    sameText((await sbx.commands.run(`cat ${home}/gzip.txt`)).stdout, compressible, 'a gzip upload as stored in the sandbox')
    sameText(await sbx.files.read(`${home}/gzip.txt`), compressible, 'a gzip upload read back')
  })

  it('a read with gzip: true returns the file as it is', slow, async () => {
    // Asked with Accept-Encoding: gzip, the answer may come compressed; the
    // SDK's fetch undoes it by Content-Encoding.
    await sbx.files.write(`${home}/plain.txt`, compressible)
    sameText(await sbx.files.read(`${home}/plain.txt`, { gzip: true }), compressible, 'a read with gzip: true')
    const bytes = await sbx.files.read(`${home}/plain.txt`, { gzip: true, format: 'bytes' })
    assert.equal(bytes.length, compressible.length)
  })

  it('write several files in one call', slow, async () => {
    const infos = await sbx.files.write([
      { path: `${home}/multi/a.txt`, data: 'A' },
      { path: `${home}/multi/b.txt`, data: 'B' },
      { path: `${home}/multi/c.bin`, data: bytes0to255(1).buffer },
    ])
    assert.ok(Array.isArray(infos) && infos.length === 3, `write of 3 files returned ${JSON.stringify(infos)}`)
    assert.deepEqual(infos.map((i) => i.path).sort(), [`${home}/multi/a.txt`, `${home}/multi/b.txt`, `${home}/multi/c.bin`])
    assert.equal(await sbx.files.read(`${home}/multi/a.txt`), 'A')
    assert.equal(await sbx.files.read(`${home}/multi/b.txt`), 'B')
    assert.deepEqual(Buffer.from(await sbx.files.read(`${home}/multi/c.bin`, { format: 'bytes' })), Buffer.from(bytes0to255(1)))
  })

  it('makeDir, list, exists and getInfo', slow, async () => {
    const dir = `${home}/tree`
    assert.equal(await sbx.files.makeDir(`${dir}/sub`), true)
    assert.equal(await sbx.files.makeDir(`${dir}/sub`), false, 'makeDir of an existing directory')
    await sbx.files.write(`${dir}/top.txt`, '12345')
    await sbx.files.write(`${dir}/sub/inner.txt`, 'x')

    const entries = await sbx.files.list(dir)
    const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
    assert.deepEqual(Object.keys(byName).sort(), ['sub', 'top.txt'])
    assert.equal(byName.sub.type, FileType.DIR)
    assert.equal(byName.sub.path, `${dir}/sub`)
    assert.equal(byName['top.txt'].type, FileType.FILE)
    assert.equal(byName['top.txt'].size, 5)

    // envd's mode is the permission bits alone, not Go's type bits.
    assert.equal(byName.sub.mode, 0o755, `a directory's mode ${byName.sub.mode}`)

    const deep = await sbx.files.list(dir, { depth: 2 })
    assert.deepEqual(deep.map((e) => e.path).sort(), [`${dir}/sub`, `${dir}/sub/inner.txt`, `${dir}/top.txt`])

    assert.equal(await sbx.files.exists(`${dir}/top.txt`), true)
    assert.equal(await sbx.files.exists(`${dir}/sub`), true)
    assert.equal(await sbx.files.exists(`${dir}/missing.txt`), false)

    const info = await sbx.files.getInfo(`${dir}/top.txt`)
    assert.equal(info.name, 'top.txt')
    assert.equal(info.path, `${dir}/top.txt`)
    assert.equal(info.type, FileType.FILE)
    assert.equal(info.size, 5)
    assert.equal(info.owner, 'user')
    assert.equal(info.group, 'user')
    assert.match(info.permissions, /^-rw/)
    assert.ok(info.modifiedTime instanceof Date && Math.abs(info.modifiedTime - Date.now()) < 120_000, `modifiedTime ${info.modifiedTime}`)
  })

  it('rename moves a file', slow, async () => {
    await sbx.files.write(`${home}/old-name.txt`, 'moving')
    const info = await sbx.files.rename(`${home}/old-name.txt`, `${home}/new-name.txt`)
    assert.equal(info.path, `${home}/new-name.txt`)
    assert.equal(info.name, 'new-name.txt')
    assert.equal(await sbx.files.exists(`${home}/old-name.txt`), false)
    assert.equal(await sbx.files.read(`${home}/new-name.txt`), 'moving')
  })

  it('remove deletes a file and a directory with its contents', slow, async () => {
    await sbx.files.write(`${home}/gone/inside/f.txt`, 'x')
    await sbx.files.write(`${home}/gone.txt`, 'x')
    await sbx.files.remove(`${home}/gone.txt`)
    assert.equal(await sbx.files.exists(`${home}/gone.txt`), false)
    await sbx.files.remove(`${home}/gone`)
    assert.equal(await sbx.files.exists(`${home}/gone`), false)
  })

  it('remove of a path that does not exist succeeds, as envd\'s does', slow, async () => {
    await sbx.files.remove(`${home}/never-was`)
    assert.equal(await sbx.files.exists(`${home}/never-was`), false)
  })

  it('a symbolic link is described by its resolved target, as envd does', slow, async () => {
    await sbx.files.makeDir(`${home}/link-target/inside`)
    const made = await sbx.commands.run(`ln -s link-target ${home}/link-1 && ln -s link-1 ${home}/link-2 && ln -s nowhere ${home}/link-broken`)
    assert.equal(made.exitCode, 0)
    const info = await sbx.files.getInfo(`${home}/link-2`)
    assert.equal(info.symlinkTarget, `${home}/link-target`)
    assert.equal(info.type, FileType.DIR)
    assert.equal(info.mode, 0o755)
    assert.match(info.permissions, /^L/)
    const broken = await sbx.files.getInfo(`${home}/link-broken`)
    assert.equal(broken.symlinkTarget, `${home}/link-broken`)
    assert.notEqual(broken.type, FileType.DIR)
    assert.notEqual(broken.type, FileType.FILE)
    const listed = Object.fromEntries((await sbx.files.list(home)).map((e) => [e.name, e]))
    assert.equal(listed['link-1'].symlinkTarget, `${home}/link-target`)
    assert.equal(listed['link-1'].type, FileType.DIR)
  })

  it('a missing file is FileNotFoundError for read, list and getInfo', slow, async () => {
    await assert.rejects(sbx.files.read(`${home}/no-such-file`), FileNotFoundError)
    await assert.rejects(sbx.files.list(`${home}/no-such-dir`), FileNotFoundError)
    await assert.rejects(sbx.files.getInfo(`${home}/no-such-file`), FileNotFoundError)
  })

  it('user: root writes as root where the default user may not', slow, async () => {
    const info = await sbx.files.write('/root/by-root.txt', 'root was here', { user: 'root' })
    assert.equal(info.path, '/root/by-root.txt')
    assert.equal((await sbx.files.getInfo('/root/by-root.txt', { user: 'root' })).owner, 'root')
    assert.equal(await sbx.files.read('/root/by-root.txt', { user: 'root' }), 'root was here')
    await assert.rejects(sbx.files.write('/root/by-user.txt', 'no'), Error, 'the default user wrote into /root')
  })

  it('uploadUrl and downloadUrl work with a plain fetch and no key', slow, async () => {
    const path = `${home}/via-url.txt`
    const up = await sbx.uploadUrl(path)
    assert.match(new URL(up).searchParams.get('signature') ?? '', /^v1_/, `upload URL is not signed: ${up}`)
    const form = new FormData()
    form.append('file', new Blob(['uploaded through a signed URL']), 'via-url.txt')
    const res = await fetch(up, { method: 'POST', body: form })
    const answer = await res.text()
    assert.ok(res.ok, `upload: ${res.status} ${answer}`)
    // envd's answer, to the byte: each file's name, path and type.
    assert.equal(answer.trim(), JSON.stringify([{ name: 'via-url.txt', path, type: 'file' }]))
    assert.equal(await sbx.files.read(path), 'uploaded through a signed URL')

    const down = await sbx.downloadUrl(path)
    assert.match(new URL(down).searchParams.get('signature') ?? '', /^v1_/, `download URL is not signed: ${down}`)
    const got = await fetch(down)
    assert.ok(got.ok, `download: ${got.status}`)
    assert.equal(await got.text(), 'uploaded through a signed URL')

    // Binary content, and a link with an expiry.
    await sbx.files.write(`${home}/via-url.bin`, bytes0to255(8).buffer)
    const timed = await sbx.downloadUrl(`${home}/via-url.bin`, { useSignatureExpiration: 120 })
    assert.ok(new URL(timed).searchParams.get('signature_expiration'), `no signature_expiration in ${timed}`)
    const bin = await fetch(timed)
    assert.ok(bin.ok, `download with expiry: ${bin.status}`)
    assert.deepEqual(Buffer.from(await bin.arrayBuffer()), Buffer.from(bytes0to255(8)))
  })

  it('signed URLs are refused when altered, expired or unsigned', slow, async () => {
    const path = `${home}/guarded.txt`
    await sbx.files.write(path, 'secret')
    await sbx.files.write(`${home}/other.txt`, 'other secret')
    const down = new URL(await sbx.downloadUrl(path))

    // The signature of one path does not open another.
    const otherPath = new URL(down)
    otherPath.searchParams.set('path', `${home}/other.txt`)
    // A signature for reading does not allow writing.
    const readAsWrite = new URL(down)
    // Nor does a signature that is not the one made for this file.
    const forged = new URL(down)
    forged.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
    // A link is refused once its expiry has passed.
    const expired = new URL(await sbx.downloadUrl(path, { useSignatureExpiration: -60 }))
    // And without a signature there is no access at all.
    const unsigned = new URL(down)
    unsigned.searchParams.delete('signature')
    unsigned.searchParams.delete('signature_expiration')

    for (const [what, url, init] of [
      ['another path', otherPath, {}],
      ['a forged signature', forged, {}],
      ['an expired link', expired, {}],
      ['no signature', unsigned, {}],
      ['a read signature used to upload', readAsWrite, { method: 'POST', body: formWith('overwritten') }],
    ]) {
      const res = await fetch(url, init)
      const body = await res.text()
      assert.ok(!res.ok, `${what}: ${res.status} ${body}`)
      assert.ok(res.status >= 400 && res.status < 500, `${what}: status ${res.status}, want a 4xx`)
      assert.ok(!body.includes('secret'), `${what}: the answer has the file's content`)
      // envd's words for the links it refuses.
      const words = { 'a forged signature': 'invalid signature', 'an expired link': 'signature is already expired' }[what]
      if (words) assert.deepEqual(JSON.parse(body), { code: 401, message: words }, what)
    }
    assert.equal(await sbx.files.read(path), 'secret')
  })

  // envd 0.6.2's user metadata (extended attributes), 0.6.3's entries in
  // watch events, 0.6.4's allowNetworkMounts: the SDK uses them when the
  // server reports envd 0.6.4. The SDKs before metadata send none.
  it('metadata written with a file is answered by write, getInfo and list, and replaced by the next write', slow, async () => {
    const path = `${home}/meta/doc.txt`
    const [written] = await sbx.files.write([{ path, data: 'v1' }], { metadata: { author: 'mish', stage: 'draft' } })
    if (written.metadata === undefined && !('metadata' in written)) {
      // An SDK without file metadata (older than envd 0.6.2's): it sent none.
      return
    }
    assert.deepEqual(written.metadata, { author: 'mish', stage: 'draft' })
    assert.deepEqual((await sbx.files.getInfo(path)).metadata, { author: 'mish', stage: 'draft' })
    const listed = (await sbx.files.list(`${home}/meta`)).find((e) => e.name === 'doc.txt')
    assert.deepEqual(listed.metadata, { author: 'mish', stage: 'draft' })
    // The next write replaces the whole set; none clears it.
    await sbx.files.write(path, 'v2', { metadata: { stage: 'final' } })
    assert.deepEqual((await sbx.files.getInfo(path)).metadata, { stage: 'final' })
    await sbx.files.write(path, 'v3')
    assert.equal((await sbx.files.getInfo(path)).metadata, undefined)
    // It is an extended attribute, as envd keeps it.
    await sbx.files.write(path, 'v4', { metadata: { author: 'mish' } })
    const r = await sbx.commands.run(`getfattr -n user.e2b.author --only-values ${path} 2>/dev/null || python3 -c "import os; print(os.getxattr('${path}', 'user.e2b.author').decode(), end='')"`)
    assert.equal(r.stdout.trim(), 'mish')
  })

  it('watchDir with includeEntry gives each event its entry; allowNetworkMounts is taken', slow, async () => {
    const dir = `${home}/watched-entries`
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { timeoutMs: 0, includeEntry: true, allowNetworkMounts: true })
    try {
      await sbx.files.write(`${dir}/e.txt`, 'entry')
      const seen = await waitFor(
        () => `an event with an entry for e.txt; got ${JSON.stringify(events)}`,
        () => events.find((e) => e.name === 'e.txt' && e.entry)
      )
      assert.equal(seen.entry.path, `${dir}/e.txt`)
      assert.equal(seen.entry.type, FileType.FILE)
    } finally {
      await handle.stop()
    }
  })

  it('watchDir reports a file written after the watch starts', slow, async () => {
    const dir = `${home}/watched`
    await sbx.files.makeDir(dir)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { timeoutMs: 0 })
    try {
      await sbx.files.write(`${dir}/new.txt`, 'hello watcher')
      const seen = await waitFor(
        () => `an event for new.txt; got ${JSON.stringify(events)}`,
        () => events.find((e) => e.name === 'new.txt')
      )
      assert.ok(
        [FilesystemEventType.CREATE, FilesystemEventType.WRITE].includes(seen.type),
        `first event for new.txt is ${seen.type}`
      )
      // A removal is reported too.
      await sbx.commands.run(`rm ${dir}/new.txt`)
      await waitFor(
        () => `a remove event for new.txt; got ${JSON.stringify(events)}`,
        () => events.find((e) => e.name === 'new.txt' && e.type === FilesystemEventType.REMOVE)
      )
    } finally {
      await handle.stop()
    }
  })

  it('a write, and an overwrite, is a WRITE event on the file itself, as envd\'s', slow, async () => {
    const dir = `${home}/watched-writes`
    await sbx.files.makeDir(dir)
    await sbx.files.write(`${dir}/kept.txt`, 'first')
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { timeoutMs: 0 })
    try {
      await sbx.files.write(`${dir}/kept.txt`, 'second, longer')
      await waitFor(
        () => `a WRITE event for kept.txt; got ${JSON.stringify(events)}`,
        () => events.find((e) => e.name === 'kept.txt' && e.type === FilesystemEventType.WRITE)
      )
      assert.equal(await sbx.files.read(`${dir}/kept.txt`), 'second, longer')
      // The file is written where it is: no temporary file comes and goes.
      assert.deepEqual(events.filter((e) => e.name !== 'kept.txt'), [])
    } finally {
      await handle.stop()
    }
  })

  it('a write as the user makes missing parents it could not make itself, as envd does', slow, async () => {
    const info = await sbx.files.write('/made-for-user/deeper/x.txt', 'mine')
    assert.equal(info.path, '/made-for-user/deeper/x.txt')
    assert.equal(await sbx.files.read('/made-for-user/deeper/x.txt'), 'mine')
    for (const p of ['/made-for-user', '/made-for-user/deeper', '/made-for-user/deeper/x.txt']) {
      const e = await sbx.files.getInfo(p)
      assert.equal(e.owner, 'user', `${p} is owned by ${e.owner}`)
    }
    assert.equal((await sbx.files.getInfo('/made-for-user')).mode, 0o755)
    // A file the user may not write stays refused: only missing parents
    // are made for it.
    await assert.rejects(sbx.files.write('/etc/hostname', 'taken'))
  })

  it('watchDir with recursive: true sees files in subdirectories', slow, async () => {
    const dir = `${home}/watched-tree`
    await sbx.files.makeDir(`${dir}/sub`)
    const events = []
    const handle = await sbx.files.watchDir(dir, (e) => events.push(e), { recursive: true, timeoutMs: 0 })
    try {
      await sbx.commands.run(`echo x > ${dir}/sub/deep.txt`)
      await waitFor(
        () => `an event for sub/deep.txt; got ${JSON.stringify(events)}`,
        () => events.find((e) => e.name === 'sub/deep.txt')
      )
    } finally {
      await handle.stop()
    }
  })

  it('watchDir of a missing directory is FileNotFoundError', slow, async () => {
    await assert.rejects(sbx.files.watchDir(`${home}/not-there`, () => {}), FileNotFoundError)
  })
})

function formWith(text) {
  const form = new FormData()
  form.append('file', new Blob([text]), 'f.txt')
  return form
}
