// Ports of an E2B sandbox through sandloop, with E2B's own SDK, unchanged:
// a server the sandbox's code starts is reached at sbx.getHost(port) (the
// host name PORT-ID.localhost:N; Node cannot resolve *.localhost, so it
// dials the server with that Host, as the docs say) and by E2B's header
// routing; a sandbox created with allowPublicTraffic: false needs its
// traffic token; a port nothing listens on answers 502; maskRequestHost
// sets the Host the app sees, and httpsPorts reaches apps serving HTTPS.
//
//   node ports.mjs
//
// Each step prints "ok <step>"; a failure prints the error and exits 1.
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from '@e2b/code-interpreter'

async function step(name, fn) {
  try {
    await fn()
    console.log(`ok ${name}`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e?.name}: ${e?.message}`)
    console.log(e?.stack)
    process.exit(1)
  }
}

const api = new URL(process.env.E2B_API_URL)

// get sends GET path to the server with the given Host and headers.
function get(host, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: api.hostname, port: api.port, path, headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

const app = (port) => `
import threading, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("app on ${'$'}{port} saw " + self.path).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", ${'$'}{port}), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
`.replaceAll('${port}', String(port))

const sbx = await Sandbox.create()
await step('a server started by runCode', async () => {
  const ex = await sbx.runCode(app(3000))
  assert.equal(ex.error, undefined)
})
await step('getHost names the port under the server', async () => {
  assert.equal(sbx.getHost(3000), `3000-${sbx.sandboxId}.localhost:${api.port}`)
})
await step('the host name reaches the app, with its own path', async () => {
  const r = await get(sbx.getHost(3000), '/hello?x=1')
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'app on 3000 saw /hello?x=1')
})
await step('header routing reaches the app', async () => {
  const r = await get(api.host, '/page.txt', { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '3000' })
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'app on 3000 saw /page.txt')
})
await step('a port nothing listens on is 502', async () => {
  const r = await get(sbx.getHost(3001), '/')
  assert.equal(r.status, 502, r.body)
})
const priv = await Sandbox.create({ network: { allowPublicTraffic: false } })
await step('a private sandbox needs its traffic token', async () => {
  await priv.runCode(app(8080))
  const without = await get(priv.getHost(8080), '/')
  assert.equal(without.status, 403, without.body)
  const wrong = await get(priv.getHost(8080), '/', { 'e2b-traffic-access-token': 'nope' })
  assert.equal(wrong.status, 403, wrong.body)
  assert.ok(priv.trafficAccessToken, 'the SDK has the traffic token')
  const ok = await get(priv.getHost(8080), '/x', { 'e2b-traffic-access-token': priv.trafficAccessToken })
  assert.equal(ok.status, 200, ok.body)
  assert.equal(ok.body, 'app on 8080 saw /x')
})
await step('a server a background command started: runCode reaches it, its preview needs this sandbox\'s token', async () => {
  const src = app(8081).replace('threading.Thread(target=srv.serve_forever, daemon=True).start()', 'srv.serve_forever()')
  await priv.files.write('/tmp/srv.py', src)
  await priv.commands.run('python3 /tmp/srv.py', { background: true })
  let ok
  for (let i = 0; i < 300; i++) {
    ok = await get(priv.getHost(8081), '/cmd', { 'e2b-traffic-access-token': priv.trafficAccessToken })
    if (ok.status === 200) break
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(ok.status, 200, ok.body)
  assert.equal(ok.body, 'app on 8081 saw /cmd')
  const ex = await priv.runCode('import urllib.request\nprint(urllib.request.urlopen("http://127.0.0.1:8081/k").read().decode())')
  assert.equal(ex.error, undefined)
  assert.equal(ex.logs.stdout.join('').trim(), 'app on 8081 saw /k')
  const other = await Sandbox.create({ network: { allowPublicTraffic: false } })
  const wrong = await get(priv.getHost(8081), '/', { 'e2b-traffic-access-token': other.trafficAccessToken })
  await other.kill()
  assert.equal(wrong.status, 403, wrong.body)
})
await step('one sandbox cannot be reached under another\'s id', async () => {
  // the public sandbox's port 8080 is not the private one's
  const r = await get(sbx.getHost(8080), '/')
  assert.equal(r.status, 502, r.body)
})
// An app that says the Host it saw, over HTTP or (with the certificate
// files) HTTPS.
const hostApp = (port, tls) => `
import threading, http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("${tls ? 'tls ' : ''}app saw " + self.path + " host " + self.headers["Host"]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("0.0.0.0", ${port}), H)
${tls ? 'ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain("/tmp/c.pem", "/tmp/k.pem"); srv.socket = ctx.wrap_socket(srv.socket, server_side=True)' : ''}
threading.Thread(target=srv.serve_forever, daemon=True).start()
`
const masked = await Sandbox.create({ network: { maskRequestHost: 'localhost:${PORT}', httpsPorts: [8443] } })
await step('maskRequestHost: the app sees that Host; httpsPorts: an app serving HTTPS (self-signed) is reached', async () => {
  assert.equal((await masked.runCode(hostApp(3000, false))).error, undefined)
  const byName = await get(masked.getHost(3000), '/a')
  assert.equal(byName.body, 'app saw /a host localhost:3000')
  const byHeader = await get(api.host, '/b', { 'E2b-Sandbox-Id': masked.sandboxId, 'E2b-Sandbox-Port': '3000' })
  assert.equal(byHeader.body, 'app saw /b host localhost:3000')
  const cert = await masked.runCode(`
import datetime
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "app")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
open("/tmp/k.pem", "wb").write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
open("/tmp/c.pem", "wb").write(cert.public_bytes(serialization.Encoding.PEM))
`)
  assert.equal(cert.error, undefined, 'a self-signed certificate')
  assert.equal((await masked.runCode(hostApp(8443, true))).error, undefined)
  const secure = await get(masked.getHost(8443), '/s')
  assert.equal(secure.status, 200, secure.body)
  assert.equal(secure.body, 'tls app saw /s host localhost:8443')
  const unmasked = await get(sbx.getHost(3000), '/c')
  assert.equal(unmasked.body, 'app on 3000 saw /c', 'another sandbox is not masked')
  const [child] = await masked.fork({ count: 1, timeoutMs: 60000 })
  try {
    assert.equal((await child.runCode(hostApp(3000, false))).error, undefined)
    const r = await get(child.getHost(3000), '/d')
    assert.equal(r.body, 'app saw /d host localhost:3000', 'a fork keeps the mask')
  } finally {
    await child.kill()
  }
})
await step('a port of sandloop\'s own in httpsPorts is refused', async () => {
  let err
  try {
    await Sandbox.create({ network: { httpsPorts: [49983] } })
  } catch (e) {
    err = e
  }
  assert.match(String(err?.message), /httpsPorts: 49983 is not a port of the sandbox's apps/)
})
await masked.kill()
await sbx.kill()
await priv.kill()
await step('a killed sandbox\'s port is gone', async () => {
  const r = await get(`3000-${sbx.sandboxId}.localhost:${api.port}`, '/')
  assert.equal(r.status, 404, r.body)
})
console.log('done')
process.exit(0)
