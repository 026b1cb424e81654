// Network options as E2B's SDK sends them: allowOut with domains and
// CIDRs, allowPublicTraffic false (the ports take traffic only with the
// sandbox's traffic access token), and updateNetwork at runtime; getInfo
// reports each. (Where a sandbox can connect with each policy is tested
// from Go against network namespaces: e2e/e2b_hosts_test.go and
// e2e/network_test.go; these tests send nothing out.)
import { after, describe, it } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'

import { Sandbox, cleanup, create, kill, slow, title, waitFor } from '../lib/sdk.js'

// getPort fetches / from port of sbx through its E2B host, with headers.
function getPort(sbx, port, headers = {}) {
  const base = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: base.hostname, port: base.port, path: '/', headers: { ...headers, Host: sbx.getHost(port) } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

describe(title('network'), { skip: typeof Sandbox.prototype.updateNetwork !== 'function' && 'no updateNetwork' }, () => {
  after(cleanup)

  it('allowOut, allowPublicTraffic false and updateNetwork do what E2B documents', slow, async () => {
    const sbx = await create({ network: { allowOut: ['example.com', '*.example.org', '203.0.113.0/24'], allowPublicTraffic: false } })
    try {
      let info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.network?.allowOut, ['example.com', '*.example.org', '203.0.113.0/24'])
      assert.equal(info.network?.allowPublicTraffic, false)
      assert.ok(sbx.trafficAccessToken, 'a traffic access token')

      await sbx.commands.run('mkdir -p /tmp/www && echo private > /tmp/www/index.html')
      await sbx.commands.run(
        "if command -v busybox >/dev/null; then exec busybox httpd -f -p 8000 -h /tmp/www; else exec python3 -m http.server 8000 --directory /tmp/www; fi",
        { background: true }
      )
      const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
      await waitFor('the page server', async () => (await getPort(sbx, 8000, token)).status === 200)
      assert.equal((await getPort(sbx, 8000)).status, 403, 'without the token')
      assert.equal((await getPort(sbx, 8000, { 'e2b-traffic-access-token': 'wrong' })).status, 403, 'with a wrong token')
      assert.equal((await getPort(sbx, 8000, token)).body.trim(), 'private')

      await sbx.updateNetwork({ allowOut: ['198.51.100.7', 'api.example.net'] })
      info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.network?.allowOut, ['198.51.100.7', 'api.example.net'])
      assert.equal(info.network?.allowPublicTraffic, false, 'updateNetwork keeps the ports private')

      await sbx.updateNetwork({ allowInternetAccess: false })
      info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.network?.allowOut, [])
      assert.equal(info.allowInternetAccess, false)
    } finally {
      await kill(sbx)
    }
  })
})
