// LangChain Deep Agents (deepagents) over E2B's SDK, against sandloop's E2B
// face. npm has no E2B backend for the JS deepagents (its sandbox backends
// are Daytona, Deno, Modal...; langchain-e2b is Python), so E2BBackend
// below is the few lines every such backend is (as @langchain/daytona's):
// BaseSandbox's execute, uploadFiles and downloadFiles over e2b's Sandbox;
// everything else (read, write, edit, ls, glob, grep, the agent's tools
// and loop) is deepagents' own, unchanged. The model is the Go test's
// scripted OpenAI-compatible server, through @langchain/openai.
//
//   node deepagents.mjs
import { NotFoundError, Sandbox } from 'e2b'
import { BaseSandbox, createDeepAgent } from 'deepagents'
import { ChatOpenAI } from '@langchain/openai'
import { assert, check, call, done, marker, model, sandboxState } from './check.mjs'

class E2BBackend extends BaseSandbox {
  constructor(sandbox, { workdir = '/home/user' } = {}) {
    super()
    this.sandbox = sandbox
    this.workdir = workdir
  }
  get id() { return this.sandbox.sandboxId }
  static async create(opts) { return new E2BBackend(await Sandbox.create({ timeoutMs: 300_000 }), opts) }
  async execute(command) {
    try {
      const r = await this.sandbox.commands.run(command, { cwd: this.workdir, timeoutMs: 120_000 })
      return { output: r.stdout + r.stderr, exitCode: r.exitCode, truncated: false }
    } catch (e) {
      // e2b throws CommandExitError for a non-zero exit: a result, not an error.
      if (e?.exitCode !== undefined) return { output: (e.stdout ?? '') + (e.stderr ?? ''), exitCode: e.exitCode, truncated: false }
      throw e
    }
  }
  async uploadFiles(files) {
    return Promise.all(files.map(async ([path, content]) => {
      try {
        await this.sandbox.files.write(path, new Blob([content]))
        return { path, error: null }
      } catch (e) {
        return { path, error: e instanceof NotFoundError ? 'file_not_found' : 'permission_denied' }
      }
    }))
  }
  async downloadFiles(paths) {
    return Promise.all(paths.map(async (path) => {
      try {
        return { path, content: await this.sandbox.files.read(path, { format: 'bytes' }), error: null }
      } catch (e) {
        return { path, content: null, error: e instanceof NotFoundError ? 'file_not_found' : 'permission_denied' }
      }
    }))
  }
}

let b
await check('backend: a sandbox, and execute runs a command', async () => {
  b = new E2BBackend(await Sandbox.create({ timeoutMs: 300_000 }), { workdir: '/workspace' })
  const r = await b.execute('echo hello && python3 -c "print(6*7)"')
  assert.equal(r.exitCode, 0, r.output)
  assert.equal(r.output, 'hello\n42\n')
})

await check('execute: a failing command is a result with its exit code', async () => {
  const r = await b.execute('echo oops >&2; exit 3')
  assert.equal(r.exitCode, 3)
  assert.match(r.output, /oops/)
})

await check('write then read (with offset and limit)', async () => {
  const w = await b.write('/workspace/notes.md', 'one\ntwo\nthree\nfour\n')
  assert.equal(w.error, undefined, w.error)
  const r = await b.read('/workspace/notes.md')
  assert.equal(r.error, undefined, r.error)
  assert.match(String(r.content), /one[\s\S]*four/)
  const part = await b.read('/workspace/notes.md', 1, 2)
  assert.match(String(part.content), /two[\s\S]*three/)
  assert.doesNotMatch(String(part.content), /one|four/)
})

await check('edit replaces a string, refuses a missing one', async () => {
  const e = await b.edit('/workspace/notes.md', 'two', 'TWO')
  assert.equal(e.error, undefined, e.error)
  assert.match((await b.execute('cat /workspace/notes.md')).output, /one\nTWO\nthree/)
  const missing = await b.edit('/workspace/notes.md', 'absent text', 'x')
  assert.ok(missing.error, 'editing a string that is not there must fail')
})

await check('ls, glob and grep', async () => {
  await b.write('/workspace/src/a.py', `print("${marker}")\n`)
  await b.write('/workspace/src/b.txt', 'nothing here\n')
  const ls = await b.ls('/workspace/src')
  assert.deepEqual(ls.files.map((f) => f.path.replace(/\/$/, '').split('/').pop()).sort(), ['a.py', 'b.txt'])
  const g = await b.glob('**/*.py', '/workspace')
  assert.deepEqual(g.files.map((f) => f.path.split('/').pop()), ['a.py'])
  const m = await b.grep(marker, '/workspace')
  assert.equal(m.matches?.length, 1, JSON.stringify(m))
  assert.match(m.matches[0].path, /a\.py$/)
})

await check('uploadFiles and downloadFiles keep bytes', async () => {
  const bytes = new Uint8Array(256).map((_, i) => i)
  const [up] = await b.uploadFiles([['/workspace/bin.dat', bytes]])
  assert.equal(up.error, null)
  const [down] = await b.downloadFiles(['/workspace/bin.dat'])
  assert.deepEqual(Buffer.from(down.content), Buffer.from(bytes))
  const [none] = await b.downloadFiles(['/workspace/absent'])
  assert.equal(none.error, 'file_not_found')
})

await check('write and read in /tmp (a file one command wrote, another reads)', async () => {
  const w = await b.write('/tmp/scratch.txt', 'scratch\n')
  assert.equal(w.error, undefined, w.error)
  assert.equal((await b.execute('cat /tmp/scratch.txt')).output, 'scratch\n')
})

let home
await check("the home /home/user as workdir (langchain-e2b's default)", async () => {
  home = await E2BBackend.create()
  const r = await home.execute('pwd && echo hi > here.txt && cat /home/user/here.txt')
  assert.equal(r.exitCode, 0, r.output)
  assert.equal(r.output, '/home/user\nhi\n')
})

const llm = new ChatOpenAI({ model: model.name, apiKey: model.apiKey, configuration: { baseURL: model.baseURL } })
const agent = () => createDeepAgent({ model: llm, backend: b, systemPrompt: 'You work in the sandbox.' })
const answer = (res) => String(res.messages.at(-1).content)
const trace = (res) => res.messages.map((m) => `${m.getType?.() ?? m.type}: ${typeof m.content === 'string' ? m.content : JSON.stringify(m.content)}`).join('\n')

await check('an agent runs execute through the backend', async () => {
  const res = await agent().invoke({ messages: [{ role: 'user', content: call(['execute', { command: 'python3 -c "print(sum(range(10)))"' }]) }] })
  assert.match(answer(res), /45/, trace(res))
})

await check('an agent writes and reads a file (write_file, read_file)', async () => {
  const res = await agent().invoke({ messages: [{ role: 'user', content: call(
    ['write_file', { file_path: '/workspace/agent.txt', content: `written by the agent ${marker}\n` }],
    ['read_file', { file_path: '/workspace/agent.txt' }],
  ) }] })
  assert.match(answer(res), new RegExp(`written by the agent ${marker}`), trace(res))
  assert.equal((await b.execute('cat /workspace/agent.txt')).output, `written by the agent ${marker}\n`)
})

await check('an agent edits a file (edit_file)', async () => {
  await agent().invoke({ messages: [{ role: 'user', content: call(
    ['edit_file', { file_path: '/workspace/agent.txt', old_string: 'written', new_string: 'edited' }],
  ) }] })
  assert.equal((await b.execute('cat /workspace/agent.txt')).output, `edited by the agent ${marker}\n`)
})

await check('an agent lists, globs and greps (ls, glob, grep)', async () => {
  const res = await agent().invoke({ messages: [{ role: 'user', content: call(
    ['ls', { path: '/workspace/src' }],
    ['glob', { pattern: '*.txt', path: '/workspace/src' }],
    ['grep', { pattern: marker, path: '/workspace/src' }],
  ) }] })
  assert.match(answer(res), /a\.py/, trace(res))
})

await check('an agent streams its run', async () => {
  const seen = []
  for await (const chunk of await agent().stream({ messages: [{ role: 'user', content: call(['execute', { command: 'echo streamed' }]) }] }, { streamMode: 'values' })) {
    seen.push(chunk)
  }
  assert.match(String(seen.at(-1).messages.at(-1).content), /streamed/)
})

await check('a long-running command started in the background survives its command', async () => {
  await b.execute(`nohup python3 -c 'import time; time.sleep(300)' ${marker} >/dev/null 2>&1 &`)
  const r = await b.execute(`pgrep -f 'time.sleep\\(300\\)' >/dev/null && echo alive || echo gone`)
  assert.equal(r.output, 'alive\n')
})

await check('kill removes the sandboxes', async () => {
  for (const x of [b, home]) {
    if (!x) continue
    await x.sandbox.kill()
    assert.equal(await sandboxState(x.id), 'HTTP 404')
  }
})

done()
