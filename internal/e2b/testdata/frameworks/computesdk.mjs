// ComputeSDK's E2B provider (@computesdk/e2b with computesdk), unchanged,
// against sandloop's E2B face: its README's examples, as written.
//
//   node computesdk.mjs
import http from 'node:http'
import { compute } from 'computesdk'
import { e2b } from '@computesdk/e2b'
import { assert, check, done, marker, sandboxState } from './check.mjs'

compute.setConfig({ provider: e2b({ apiKey: process.env.E2B_API_KEY }) })

let sandbox
await check('compute.sandbox.create', async () => {
  sandbox = await compute.sandbox.create()
  assert.ok(sandbox.sandboxId)
  assert.equal(await sandboxState(sandbox.sandboxId), 'running')
})

await check("README quick start: python - <<'PY' with pandas", async () => {
  const result = await sandbox.runCommand(`python - <<'PY'
import pandas as pd
import numpy as np

data = {'A': [1, 2, 3], 'B': [4, 5, 6]}
df = pd.DataFrame(data)
print(df)
print(f"Sum: {df.sum().sum()}")
PY`)
  assert.equal(result.exitCode, 0, result.stderr)
  assert.match(result.stdout, /Sum: 21/)
})

await check('README filesystem: writeFile /tmp/hello.py, readFile, run it', async () => {
  await sandbox.filesystem.writeFile('/tmp/hello.py', 'print("Hello World")')
  assert.equal(await sandbox.filesystem.readFile('/tmp/hello.py'), 'print("Hello World")')
  const r = await sandbox.runCommand('python3 /tmp/hello.py')
  assert.equal(r.stdout, 'Hello World\n', r.stderr)
})

await check('filesystem mkdir, readdir, exists, remove (in the home)', async () => {
  const dir = '/home/user/data'
  await sandbox.filesystem.mkdir(dir)
  await sandbox.filesystem.writeFile(`${dir}/people.csv`, 'name,age\nAlice,25\n')
  const entries = await sandbox.filesystem.readdir(dir)
  assert.deepEqual(entries.map((e) => [e.name, e.type]), [['people.csv', 'file']])
  assert.equal(await sandbox.filesystem.exists(`${dir}/people.csv`), true)
  await sandbox.filesystem.remove(`${dir}/people.csv`)
  assert.equal(await sandbox.filesystem.exists(`${dir}/people.csv`), false)
})

await check('runCommand with env and cwd; a failing command is a result', async () => {
  const r = await sandbox.runCommand(`sh -c 'echo "$GREETING from $(pwd)"'`, { env: { GREETING: 'hi there' }, cwd: '/workspace' })
  assert.equal(r.exitCode, 0, r.stderr)
  assert.equal(r.stdout, 'hi there from /workspace\n')
  const bad = await sandbox.runCommand('echo oops >&2; exit 3')
  assert.equal(bad.exitCode, 3)
  assert.equal(bad.stderr, 'oops\n')
})

// get sends GET path to sandloop's address with the host of url, as a
// browser resolving *.localhost would.
function get(url, path) {
  const api = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: api.hostname, port: api.port, path, headers: { Host: new URL(url).host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

await check('a background server (runCommand background: true) answers at getUrl', async () => {
  await sandbox.runCommand('echo served > /workspace/index.txt')
  await sandbox.runCommand(`python3 -c 'import http.server as h, os; os.chdir("/workspace"); h.ThreadingHTTPServer(("0.0.0.0", 8000), h.SimpleHTTPRequestHandler).serve_forever()' ${marker}`, { background: true })
  const url = await sandbox.getUrl({ port: 8000, protocol: 'http' })
  assert.match(url, new RegExp(`^http://8000-${sandbox.sandboxId}\\.localhost:\\d+$`))
  let r
  for (let i = 0; i < 40; i++) {
    r = await get(url, '/index.txt')
    if (r.status === 200) break
    await new Promise((ok) => setTimeout(ok, 250))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'served\n')
})

await check('getById, then destroy removes the sandbox', async () => {
  const again = await compute.sandbox.getById(sandbox.sandboxId)
  assert.equal(again?.sandboxId, sandbox.sandboxId)
  await sandbox.destroy()
  assert.equal(await sandboxState(sandbox.sandboxId), 'HTTP 404')
})

done()
