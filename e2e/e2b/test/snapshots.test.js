// Snapshots as E2B's SDK makes and uses them: createSnapshot (named and
// not), listSnapshots (all, by sandbox, by name), Sandbox.create(snapshotId)
// any number of times, each with its own copy of the files, and
// deleteSnapshot. sandboxd keeps a snapshot's files (not its memory, nor
// /tmp, a tmpfs: see docs/E2B.md).
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, cleanup, create, kill, lacks, runId, shortTimeoutMs, slow, tag, title } from '../lib/sdk.js'

// collect reads every page of a paginator.
async function collect(pages) {
  const out = []
  while (pages.hasNext) out.push(...(await pages.nextItems()))
  return out
}

describe(title('snapshots'), { skip: lacks.snapshots }, () => {
  after(cleanup)

  it('a snapshot starts new sandboxes with the files of its sandbox, and is deleted', slow, async () => {
    const name = `snap-${runId}`.toLowerCase().replace(/[^a-z0-9-]/g, '-')
    const src = await create()
    const made = []
    try {
      await src.files.write('/home/user/snap/state.txt', 'saved')
      const named = await src.createSnapshot({ name })
      assert.deepEqual(named.names, [name])
      assert.match(named.snapshotId, new RegExp(`^${name}:`))
      // The sandbox runs on.
      assert.equal(await src.files.read('/home/user/snap/state.txt'), 'saved')

      for (let i = 0; i < 2; i++) {
        const sbx = await Sandbox.create(named.snapshotId, { timeoutMs: shortTimeoutMs, metadata: tag })
        made.push(sbx)
      }
      const [one, two] = made
      assert.equal(await one.files.read('/home/user/snap/state.txt'), 'saved')
      // A snapshot of a base sandbox runs commands as base's do.
      assert.equal((await one.commands.run('whoami; pwd')).stdout, 'user\n/home/user\n')
      await one.files.write('/home/user/snap/state.txt', 'changed in one')
      assert.equal(await two.files.read('/home/user/snap/state.txt'), 'saved', 'each sandbox has its own copy')

      // Listed: all, by the sandbox, by name.
      const all = await collect(Sandbox.listSnapshots())
      assert.ok(all.some((s) => s.snapshotId === named.snapshotId), 'listSnapshots()')
      const bySandbox = await collect(src.listSnapshots())
      assert.deepEqual(bySandbox.map((s) => s.snapshotId), [named.snapshotId])
      const byName = await collect(Sandbox.listSnapshots({ name }))
      assert.deepEqual(byName.map((s) => s.snapshotId), [named.snapshotId])

      // Unnamed: an id of its own, no names.
      const unnamed = await Sandbox.createSnapshot(src.sandboxId)
      assert.deepEqual(unnamed.names, [])
      assert.notEqual(unnamed.snapshotId, named.snapshotId)
      assert.equal(await Sandbox.deleteSnapshot(unnamed.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(unnamed.snapshotId), false, 'deleted twice')

      // Deleted once no sandbox runs it.
      for (const sbx of made.splice(0)) await sbx.kill()
      assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), true)
      const left = await collect(Sandbox.listSnapshots({ sandboxId: src.sandboxId }))
      assert.deepEqual(left, [])
    } finally {
      for (const sbx of made) await kill(sbx)
      await kill(src)
    }
  })
})
