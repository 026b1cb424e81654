// getMetrics({ start, end }): the samples the server took every 5 s of
// the sandbox's cgroup within the range, oldest first, and one taken now
// when the range reaches now; a range in the past answers only what was
// taken then.
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'

import { cleanup, create, kill, sleep, slow, title } from '../lib/sdk.js'

describe(title('metrics'), () => {
  after(cleanup)

  it('getMetrics answers the samples within start and end', slow, async () => {
    const sbx = await create()
    try {
      const started = new Date()
      await sbx.commands.run('i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done') // some CPU
      await sleep(11_000) // two samples at least, 5 s apart
      const all = await sbx.getMetrics({ start: new Date(started.getTime() - 1000), end: new Date(Date.now() + 1000) })
      assert.ok(all.length >= 3, `${all.length} metrics: ${JSON.stringify(all)}`)
      for (let i = 1; i < all.length; i++) {
        assert.ok(new Date(all[i].timestamp) >= new Date(all[i - 1].timestamp), 'oldest first')
      }
      for (const m of all) {
        assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed, `memory ${m.memUsed}/${m.memTotal}`)
        assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpu ${m.cpuUsedPct}`)
        assert.ok(m.cpuCount > 0)
      }
      // Only the first samples: a range that ends before now.
      const cut = new Date(all[1].timestamp)
      const early = await sbx.getMetrics({ start: new Date(started.getTime() - 1000), end: cut })
      assert.ok(early.length >= 1 && early.length < all.length, `${early.length} of ${all.length}`)
      for (const m of early) assert.ok(new Date(m.timestamp) <= new Date(cut.getTime() + 1000), `${m.timestamp} after ${cut.toISOString()}`)
    } finally {
      await kill(sbx)
    }
  })
})
