// Mastra workspaces on E2B (@mastra/e2b's E2BSandbox in @mastra/core's
// Workspace), unchanged, against sandloop's E2B face; the agent's model is
// the Go test's scripted OpenAI-compatible server (Chat Completions).
//
//   node mastra.mjs
import http from 'node:http'
import { Agent } from '@mastra/core/agent'
import { Workspace } from '@mastra/core/workspace'
import { E2BSandbox } from '@mastra/e2b'
import { Sandbox } from 'e2b'
import { assert, check, call, done, marker, model, sandboxState } from './check.mjs'

await check('default template: start() checks for and builds mastra-<hash>', async () => {
  // No template given: E2BSandbox asks GET /templates/aliases/mastra-<hash>
  // and builds it (from base, apt s3fs and fuse) if it is not there.
  const sb = new E2BSandbox({ id: `default-${marker}` })
  try {
    await sb.start()
    assert.equal(await sandboxState(sb.e2b.sandboxId), 'running')
  } finally {
    await sb.destroy().catch(() => {})
  }
})

const sandbox = new E2BSandbox({ id: `ws-${marker}`, template: 'base', timeout: 300_000 })
const workspace = new Workspace({ id: `ws-${marker}`, sandbox })
let firstId

await check("workspace.init starts the E2B sandbox (template 'base')", async () => {
  await workspace.init()
  firstId = sandbox.e2b.sandboxId
  assert.equal(await sandboxState(firstId), 'running')
  assert.equal(sandbox.status, 'running')
})

await check('executeCommand runs a command and returns its output', async () => {
  const r = await sandbox.executeCommand('python3', ['-c', 'print(6*7)'])
  assert.equal(r.exitCode, 0, r.stderr)
  assert.equal(r.stdout.trim(), '42')
})

await check('executeCommand: a failing command is a result with its exit code', async () => {
  const r = await sandbox.executeCommand('sh', ['-c', 'echo oops >&2; exit 3'])
  assert.equal(r.exitCode, 3)
  assert.equal(r.success, false)
  assert.match(r.stderr, /oops/)
})

await check('writeFiles into /home/user, read by a command', async () => {
  await sandbox.writeFiles([{ path: '/home/user/app/config.json', content: `{"marker":"${marker}"}` }])
  const r = await sandbox.executeCommand('cat', ['/home/user/app/config.json'])
  assert.equal(r.stdout, `{"marker":"${marker}"}`, r.stderr)
})

await check('a file in /tmp written by one command is read by the next', async () => {
  await sandbox.executeCommand('sh', ['-c', 'echo shared > /tmp/mastra-shared.txt'])
  const r = await sandbox.executeCommand('cat', ['/tmp/mastra-shared.txt'])
  assert.equal(r.stdout, 'shared\n', r.stderr)
})

// get sends GET path to sandloop's address with the host of url, as a
// browser resolving *.localhost would.
function get(url, path) {
  const api = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    http.request({ host: api.hostname, port: api.port, path, headers: { Host: new URL(url).host } }, (res) => {
      let body = ''
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject).end()
  })
}

let server
await check('processes: spawn a server, list it, read its output', async () => {
  server = await sandbox.processes.spawn(`python3 -u -c 'import http.server as h, os; os.chdir("/workspace"); open("index.txt","w").write("up\\n"); print("serving", flush=True); h.ThreadingHTTPServer(("0.0.0.0", 8123), h.SimpleHTTPRequestHandler).serve_forever()' ${marker}-server`)
  const listed = await sandbox.processes.list()
  assert.ok(listed.some((p) => p.pid === String(server.pid) && p.command.includes(`${marker}-server`)), JSON.stringify(listed))
  for (let i = 0; i < 40 && !/serving/.test(server.stdout); i++) await new Promise((ok) => setTimeout(ok, 250))
  assert.match(server.stdout, /serving/)
})

await check('a spawned server answers at networking.getPortUrl', async () => {
  const url = await sandbox.networking.getPortUrl(8123)
  let r
  for (let i = 0; i < 40; i++) {
    r = await get(url, '/index.txt')
    if (r.status === 200) break
    await new Promise((ok) => setTimeout(ok, 250))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'up\n')
})

await check('processes.kill ends the server', async () => {
  assert.ok(server, 'no server was spawned')
  await sandbox.processes.kill(String(server.pid))
  const after = await sandbox.processes.list()
  assert.ok(!after.some((p) => p.pid === String(server.pid)), JSON.stringify(after))
})

await check('an agent with the workspace runs a command through its tool', async () => {
  const agent = new Agent({
    id: 'fw-agent',
    name: 'fw-agent',
    instructions: 'You work in the sandbox.',
    model: { id: `openai/${model.name}`, url: model.baseURL, apiKey: model.apiKey, api: 'chat' },
    workspace,
  })
  const res = await agent.generate(call(['mastra_workspace_execute_command', { command: 'echo agent-ran' }]))
  assert.match(res.text, /agent-ran/)
})

await check('workspace.stop pauses the sandbox; the next command finds it by metadata and resumes it', async () => {
  await sandbox.executeCommand('sh', ['-c', 'echo kept > /workspace/kept.txt'])
  await workspace.stop()
  assert.equal(await sandboxState(firstId), 'paused')
  const r = await sandbox.executeCommand('cat', ['/workspace/kept.txt'])
  assert.equal(r.stdout, 'kept\n', r.stderr)
  assert.equal(sandbox.e2b.sandboxId, firstId)
  assert.equal(await sandboxState(firstId), 'running')
})

await check('a command with a timeout is killed and leaves nothing running', async () => {
  const r = await sandbox.executeCommand('python3', ['-c', 'import time; time.sleep(600)', `${marker}-sleep`], { timeout: 2000 })
  assert.notEqual(r.exitCode, 0)
  // The server kills it at the deadline, as envd does: wait for the list to say so.
  let listed
  for (let i = 0; i < 40; i++) {
    listed = await sandbox.processes.list()
    if (!listed.some((p) => p.command.includes(`${marker}-sleep`))) return
    await new Promise((ok) => setTimeout(ok, 250))
  }
  assert.fail(`still running 10 s after its timeout: ${JSON.stringify(listed)}`)
})

await check('workspace.destroy kills the sandbox', async () => {
  await workspace.destroy()
  assert.equal(await sandboxState(firstId), 'HTTP 404')
  const left = await Sandbox.list({ query: { metadata: { 'mastra-sandbox-id': `ws-${marker}` } } }).nextItems()
  assert.deepEqual(left.map((s) => s.sandboxId), [])
})

done()
