// Volumes as E2B's SDK makes and uses them: Volume.create, list, getInfo,
// connect and destroy, and Sandbox.create({volumeMounts}) in both of the
// SDK's forms (a Volume, or a volume's name): a file written in the mount
// by one sandbox is read by the next. sandboxd serves no volume content
// API (Volume#list, readFile, writeFile, ...): a volume's files are
// reached through a sandbox that mounts it (see docs/E2B.md).
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import { e2b, NotFoundError, cleanup, create, kill, runId, sdkVersion, slow, title } from '../lib/sdk.js'

const { Volume, VolumeError } = e2b
// 2.31 raises NotFoundError where later versions raise VolumeNotFoundError.
const VolumeNotFoundError = e2b.VolumeNotFoundError ?? NotFoundError
const lacksVolumes = typeof Volume?.create !== 'function' && `e2b@${sdkVersion} has no Volume`

const otherKey = process.env.E2B_OTHER_API_KEY

// status is the HTTP status a VolumeError's message starts with (the SDK
// puts it there: "409: ...").
const status = (err) => Number(/^(\d{3}):/.exec(err?.message ?? '')?.[1])

describe(title('volumes'), { skip: lacksVolumes }, () => {
  const made = [] // volume ids this file created, destroyed after
  after(async () => {
    await cleanup()
    for (const id of made) await Volume.destroy(id).catch(() => {})
  })

  it('a volume keeps what one sandbox wrote for the next, and is destroyed once none mounts it', slow, async () => {
    const name = `data-${runId}`.replace(/[^A-Za-z0-9._-]/g, '-')
    const vol = await Volume.create(name)
    made.push(vol.volumeId)
    assert.equal(vol.name, name)
    assert.match(vol.volumeId, /^vol_/)
    assert.equal(typeof vol.token, 'string', 'a token, as the SDK types it (sandboxd answers a fixed word that grants nothing)')

    const listed = await Volume.list()
    assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === name), `Volume.list() has ${name}: ${JSON.stringify(listed)}`)
    const info = await Volume.getInfo(vol.volumeId)
    assert.equal(info.volumeId, vol.volumeId)
    assert.equal(info.name, name)
    const connected = await Volume.connect(vol.volumeId)
    assert.equal(connected.name, name)
    await assert.rejects(Volume.create(name), (err) => err instanceof VolumeError && status(err) === 409, 'a name the account has')

    let writer, reader
    try {
      // The SDK's map of mount path to a Volume...
      writer = await create({ volumeMounts: { '/mnt/data': vol } })
      const got = await writer.getInfo()
      assert.deepEqual(got.volumeMounts, [{ name, path: '/mnt/data' }], 'getInfo names the mount')
      const mounts = (await writer.commands.run("awk '$2 == \"/mnt/data\" {print $3}' /proc/mounts")).stdout
      assert.match(mounts, /\S/, 'a file system is mounted at /mnt/data')
      const wrote = await writer.commands.run('echo "written by $(whoami)" > /mnt/data/hello.txt && mkdir -p /mnt/data/dir && echo nested > /mnt/data/dir/n.txt && cat /mnt/data/hello.txt')
      assert.equal(wrote.stdout, 'written by user\n')
      assert.equal(await writer.files.read('/mnt/data/dir/n.txt'), 'nested\n', 'the files API sees the mount too')

      // One writer at a time, and no destroy while it is mounted.
      await assert.rejects(create({ volumeMounts: { '/mnt/data': name } }), (err) => (err.statusCode ?? status(err)) === 409, 'a second sandbox mounting it')
      await assert.rejects(Volume.destroy(vol.volumeId), (err) => err instanceof VolumeError && status(err) === 409 && /attached/.test(err.message), 'destroy while mounted')

      await writer.kill()
      writer = undefined

      // ...and a volume's name.
      reader = await create({ volumeMounts: { '/data': name } })
      assert.equal((await reader.commands.run('cat /data/hello.txt /data/dir/n.txt')).stdout, 'written by user\nnested\n')
      assert.equal(await reader.files.read('/data/hello.txt'), 'written by user\n')
      await reader.kill()
      reader = undefined
    } finally {
      await kill(writer)
      await kill(reader)
    }

    assert.equal(await Volume.destroy(vol.volumeId), true)
    made.splice(made.indexOf(vol.volumeId), 1)
    await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
    assert.equal(await Volume.destroy(vol.volumeId), false, 'destroyed twice')
    assert.ok(!(await Volume.list()).some((v) => v.volumeId === vol.volumeId), 'listed after its destroy')
    await assert.rejects(create({ volumeMounts: { '/data': name } }), (err) => (err.statusCode ?? status(err)) === 404, 'a sandbox mounting a destroyed volume')
  })

  it("another account neither sees, mounts nor destroys a volume", { ...slow, skip: !otherKey && 'E2B_OTHER_API_KEY is not set' }, async () => {
    const name = `private-${runId}`.replace(/[^A-Za-z0-9._-]/g, '-')
    const vol = await Volume.create(name)
    made.push(vol.volumeId)
    const other = { apiKey: otherKey }
    assert.ok(!(await Volume.list(other)).some((v) => v.volumeId === vol.volumeId), 'listed for another account')
    await assert.rejects(Volume.getInfo(vol.volumeId, other), VolumeNotFoundError)
    assert.equal(await Volume.destroy(vol.volumeId, other), false)
    await assert.rejects(create({ ...other, volumeMounts: { '/data': vol.volumeId } }), (err) => (err.statusCode ?? status(err)) === 404, 'mounted by another account')
    assert.equal((await Volume.getInfo(vol.volumeId)).name, name, 'still there')
  })

  it('the volume content API is not served: its calls fail saying so', slow, async () => {
    const name = `content-${runId}`.replace(/[^A-Za-z0-9._-]/g, '-')
    const vol = await Volume.create(name)
    made.push(vol.volumeId)
    // Pointed at sandboxd (where the answered domain would lead behind the
    // operator's wildcard and TLS), every content call is 501, never a
    // path not found.
    const saved = process.env.E2B_VOLUME_API_URL
    process.env.E2B_VOLUME_API_URL = process.env.E2B_API_URL
    try {
      for (const [what, call] of [
        ['list', () => vol.list('/')],
        ['writeFile', () => vol.writeFile('/a.txt', 'x')],
        ['readFile', () => vol.readFile('/a.txt')],
      ]) {
        await assert.rejects(call(), (err) => err instanceof VolumeError && status(err) === 501 && /not served by sandboxd/.test(err.message), what)
      }
    } finally {
      if (saved === undefined) delete process.env.E2B_VOLUME_API_URL
      else process.env.E2B_VOLUME_API_URL = saved
    }
  })
})
