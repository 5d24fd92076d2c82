// The OpenAI Agents SDK (JS) with its E2B sandbox client
// (@openai/agents-extensions/sandbox/e2b), unchanged, against sandloop's
// E2B face; the model is the Go test's scripted OpenAI-compatible server
// (Chat Completions), so every tool call goes through the SDK's own loop.
//
//   node openai-agents.mjs
import http from 'node:http'
import OpenAI from 'openai'
import { Runner, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from '@openai/agents'
import { Manifest, SandboxAgent, shell, filesystem } from '@openai/agents/sandbox'
import { E2BSandboxClient } from '@openai/agents-extensions/sandbox/e2b'
import { Sandbox } from 'e2b'
import { assert, check, call, done, marker, model, sandboxState, api } from './check.mjs'

setTracingDisabled(true)
setOpenAIAPI('chat_completions')
setDefaultOpenAIClient(new OpenAI({ baseURL: model.baseURL, apiKey: model.apiKey }))

const manifest = () => new Manifest({
  entries: {
    'README.md': { type: 'file', content: `# Renewal notes ${marker}\n` },
    'data/customer.md': { type: 'file', content: 'Name: Northwind Health.\n' },
  },
})

const agent = new SandboxAgent({
  name: 'E2B sandbox assistant',
  model: model.name,
  instructions: 'Inspect the sandbox workspace before answering.',
  defaultManifest: manifest(),
  capabilities: [shell(), filesystem()],
})

// get sends GET / to sandloop's address with the given Host, as a browser
// resolving *.localhost would.
function get(host, path = '/') {
  const api = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: api.hostname, port: api.port, path, headers: { Host: host } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

// getRetry is get's body once it answers 200, within 10 s.
async function getRetry(host, path) {
  let r
  for (let i = 0; i < 40; i++) {
    r = await get(host, path)
    if (r.status === 200) return r.body
    await new Promise((ok) => setTimeout(ok, 250))
  }
  throw new Error(`GET ${path} at ${host}: ${r.status} ${r.body}`)
}

const client = new E2BSandboxClient({ exposedPorts: [8765] })
let session
await check('client.create materializes the manifest in a new sandbox', async () => {
  session = await client.create({ manifest: manifest() })
  const sbx = await Sandbox.connect(session.state.sandboxId)
  assert.equal(await sbx.files.read('/workspace/README.md'), `# Renewal notes ${marker}\n`)
  assert.equal(await sbx.files.read('/workspace/data/customer.md'), 'Name: Northwind Health.\n')
})

const runner = new Runner({ workflowName: 'sandloop frameworks test' })

await check('a run calls exec_command in the sandbox', async () => {
  const result = await runner.run(agent, call(['exec_command', { cmd: 'cat README.md && python3 -c "print(6*7)"' }]), { sandbox: { session } })
  assert.match(String(result.finalOutput), new RegExp(`Renewal notes ${marker}[\\s\\S]*42`))
})

await check('a streamed run', async () => {
  const result = await runner.run(agent, call(['exec_command', { cmd: 'ls data' }]), { sandbox: { session }, stream: true })
  let text = ''
  for await (const chunk of result.toTextStream()) text += chunk
  await result.completed
  assert.match(text, /customer\.md/)
})

await check('apply_patch creates and updates a file', async () => {
  const result = await runner.run(agent, call(
    ['apply_patch', { type: 'create_file', path: 'notes.txt', diff: '+first line\n+second line\n' }],
    ['apply_patch', { type: 'update_file', path: 'notes.txt', diff: '@@\n first line\n-second line\n+patched line\n' }],
    ['exec_command', { cmd: 'cat notes.txt' }],
  ), { sandbox: { session } })
  const outputs = result.newItems.filter((i) => i.type === 'tool_call_output_item').map((i) => i.output)
  assert.match(String(result.finalOutput), /first line\s+patched line/, `tool outputs: ${JSON.stringify(outputs)}`)
})

await check('exec_command with tty: true runs in a terminal', async () => {
  const result = await runner.run(agent, call(['exec_command', { cmd: 'test -t 1 && echo on-a-tty || echo no-tty', tty: true }]), { sandbox: { session } })
  assert.match(String(result.finalOutput), /on-a-tty/)
})

await check('exposedPorts: a server started by exec_command (tty) answers at resolveExposedPort', async () => {
  // With a terminal, exec_command yields after yield_time_ms and leaves the server running.
  await session.execCommand({ cmd: 'python3 -m http.server 8765 --bind 0.0.0.0 --directory /workspace', tty: true, yieldTimeMs: 1000 })
  const ep = await session.resolveExposedPort(8765)
  assert.match(ep.host, /^8765-.*\.localhost$/, JSON.stringify(ep))
  assert.equal(await getRetry(`${ep.host}:${ep.port}`, '/README.md'), `# Renewal notes ${marker}\n`)
})

await check('a server started in the background (cmd &) keeps running after its command', async () => {
  await session.execCommand({ cmd: `nohup python3 -c 'import http.server as h, sys; h.ThreadingHTTPServer(("0.0.0.0", 8766), h.SimpleHTTPRequestHandler).serve_forever()' ${marker} >/dev/null 2>&1 &` })
  const out = await session.execCommand({ cmd: `python3 -c 'import time, urllib.request as u
for i in range(50):
    try:
        print(u.urlopen("http://127.0.0.1:8766/README.md").read().decode()); break
    except OSError:
        time.sleep(0.2)'` })
  assert.match(out, new RegExp(`Renewal notes ${marker}`))
})

let archive
await check('persistWorkspace archives the workspace (tar)', async () => {
  archive = await session.persistWorkspace()
  assert.ok(archive.byteLength > 0)
})

await check('close kills the sandbox (pauseOnExit defaults to false)', async () => {
  const id = session.state.sandboxId
  await session.close()
  assert.equal(await sandboxState(id), 'HTTP 404')
})

await check('hydrateWorkspace restores the archive into a new sandbox', async () => {
  assert.ok(archive, 'no archive from persistWorkspace')
  const s2 = await client.create({ manifest: new Manifest() })
  try {
    await s2.hydrateWorkspace(archive)
    const out = await s2.execCommand({ cmd: 'cat notes.txt README.md' })
    assert.match(out, new RegExp(`patched line[\\s\\S]*Renewal notes ${marker}`))
  } finally {
    await s2.close()
  }
})

await check('pauseOnExit: close pauses the sandbox, resume from the serialized state continues it', async () => {
  const pausing = new E2BSandboxClient({ pauseOnExit: true })
  const s = await pausing.create({ manifest: manifest() })
  await s.execCommand({ cmd: 'echo kept > kept.txt' })
  const state = await pausing.serializeSessionState(s.state)
  const id = s.state.sandboxId
  await s.close()
  assert.equal(await sandboxState(id), 'paused')
  const resumed = await pausing.resume(await pausing.deserializeSessionState(state))
  try {
    assert.equal(resumed.state.sandboxId, id)
    assert.match(await resumed.execCommand({ cmd: 'cat kept.txt' }), /kept/)
  } finally {
    resumed.state.pauseOnExit = false
    await resumed.close()
  }
  assert.equal(await sandboxState(id), 'HTTP 404')
})

await check('an SDK-owned sandbox (Runner with the client) is created and removed by the run', async () => {
  const before = (await api('GET', '/v2/sandboxes')).json?.length ?? -1
  const r = new Runner({ workflowName: 'sdk-owned', sandbox: { client: new E2BSandboxClient() } })
  const result = await r.run(agent, call(['exec_command', { cmd: 'cat README.md' }]))
  assert.match(String(result.finalOutput), new RegExp(`Renewal notes ${marker}`))
  let after
  for (let i = 0; i < 40; i++) {
    after = (await api('GET', '/v2/sandboxes')).json?.length ?? -1
    if (after === before) break
    await new Promise((ok) => setTimeout(ok, 250))
  }
  assert.equal(after, before, 'sandboxes before and after the run')
})

done()
