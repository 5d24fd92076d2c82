// Drives a running `sandloop serve` with E2B's official SDKs, unchanged:
// only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY point them at it.
//
//   node e2e.mjs interpreter   @e2b/code-interpreter (on e2b latest): the whole tour
//   node e2e.mjs e2b-2.45      e2b 2.45: lifecycle, files and commands
//   node e2e.mjs stdin MARKER  commands with `stdin: true` (Mastra's way): ends and kills reported at
//                              once, kill/timeout of a sandbox holding one bounded; leaves one such
//                              sandbox running (`sh -c 'cat; : MARKER-left'`), attached to its stream,
//                              for the caller's SIGTERM
//   node e2e.mjs lifecycle     @e2b/code-interpreter: pause, betaPause, Sandbox.pause(id), connect resuming
//                              with the variables kept, list/getInfo states, lifecycle onTimeout 'pause'
//                              with and without autoResume
//   node e2e.mjs fork          @e2b/code-interpreter: sbx.fork({count}) and Sandbox.fork(id): each fork runs
//                              code with the source's variables and files, diverges alone, has its own
//                              time to live; a fork of a paused or unknown sandbox fails as E2B's does
//   node e2e.mjs snapshots     @e2b/code-interpreter: createSnapshot (named or not), Sandbox.create(snapshotId)
//                              with the files and variables back, listSnapshots (all, a sandbox's, by name,
//                              paged), deleteSnapshot (true, then false)
//   node e2e.mjs bench N [CODE]  N × Sandbox.create() + runCode(CODE, default '1+1'), alternating
//                                with the same through sandloop's own API (SANDLOOP_TOKEN);
//                                prints both medians in ms (CODE must evaluate to 2)
//   node e2e.mjs burst N [once|repeat] [PAUSE]  issue 26's burst: after 2 sandboxes one by one (the
//                                SDK warms up), N × (Sandbox.create() + runCode('1+1')) at once
//                                (@e2b/code-interpreter), the sandboxes killed after, then (unless once) the
//                                same once the server's warm pool holds its target again (its /healthz; at
//                                most 2 minutes) and at least PAUSE ms after the first's last answer; prints
//                                for each p50/p95/last ms, sandboxes/s, the create's and the runCode's p50,
//                                the connections opened, and the CPU ms of this process (the client), of the
//                                server (SERVER_PID, if set) and of the processes under it, one JSON line
//   node e2e.mjs computesdk N BURST  ComputeSDK's method: Sandbox.create() (e2b) + a first command
//                                (`python3 -V`), N sequential, N staggered 200 ms apart, BURST at once,
//                                and BURST again once the server's pool has refilled (its /healthz);
//                                prints median/p95/p99 ms and failures of each, one JSON line
//   node e2e.mjs keepalive MS    the SDKs' HTTP clients (undici) keep their connections to the server
//                                across MS ms idle, longer than undici's own idle default (4 s), as the
//                                server's Keep-Alive header lets them: a second Sandbox.create() +
//                                runCode('1+1') after the pause opens no connection
//   node e2e.mjs firstcommand N CMD  ComputeSDK's sequential method, timed stage by stage: for
//                                each of N, Sandbox.create() + commands.run(CMD), the wall-clock
//                                times (ms since the Unix epoch) of the start, create's answer, the
//                                first stdout and run's answer, one JSON line (the server's side
//                                of the same commands: serve --e2b-command-trace)
//
// Each step prints "ok <step>"; a failure prints the error and exits 1.
import assert from 'node:assert/strict'
import fs from 'node:fs'

const mode = process.argv[2]
const run = `run-${process.pid}-${Date.now()}`

async function step(name, fn) {
  const t0 = performance.now()
  try {
    await fn()
    console.log(`ok ${name} (${Math.round(performance.now() - t0)} ms)`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e?.name}: ${e?.message}`)
    console.log(e?.stack)
    process.exit(1)
  }
}

async function throws(fn, check) {
  let err
  try {
    await fn()
  } catch (e) {
    err = e
  }
  assert.ok(err, 'expected an error')
  if (check) check(err)
  return err
}

async function listIDs(Sandbox, metadata) {
  const pager = Sandbox.list({ query: { metadata } })
  const ids = []
  while (pager.hasNext) {
    for (const s of await pager.nextItems()) ids.push(s.sandboxId)
  }
  return ids.sort()
}

// files, commands, isolation and lifecycle: what both SDK versions share.
async function common(Sandbox, sbx, label) {
  await step(`${label} files write/read/list`, async () => {
    const info = await sbx.files.write('hello.txt', 'hello')
    assert.equal(info.path, '/home/user/hello.txt') // E2B's home; /workspace is the same directory
    assert.equal(await sbx.files.read('hello.txt'), 'hello')
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello')
    assert.equal(await sbx.files.read('/workspace/hello.txt'), 'hello')
    await sbx.files.write('sub/dir/deep.txt', 'deep')
    const names = (await sbx.files.list('.')).map((e) => `${e.name}:${e.type}`)
    assert.ok(names.includes('hello.txt:file'), names.join(','))
    assert.ok(names.includes('sub:dir'), names.join(','))
    const deep = (await sbx.files.list('.', { depth: 3 })).map((e) => e.path)
    assert.ok(deep.includes('/home/user/sub/dir/deep.txt'), deep.join(','))
  })
  await step(`${label} files exists/makeDir/rename/remove`, async () => {
    assert.equal(await sbx.files.exists('hello.txt'), true)
    assert.equal(await sbx.files.exists('nope.txt'), false)
    assert.equal(await sbx.files.makeDir('made'), true)
    assert.equal(await sbx.files.makeDir('made'), false)
    const moved = await sbx.files.rename('hello.txt', 'made/moved.txt')
    assert.equal(moved.path, '/home/user/made/moved.txt')
    assert.equal(await sbx.files.exists('hello.txt'), false)
    assert.equal(await sbx.files.read('made/moved.txt'), 'hello')
    await sbx.files.remove('made')
    assert.equal(await sbx.files.exists('made/moved.txt'), false)
    await throws(() => sbx.files.read('made/moved.txt'), (e) => assert.match(e.name, /NotFoundError/))
    await throws(() => sbx.files.read('/etc/passwd'))
  })
  await step(`${label} files bytes and 1 MiB`, async () => {
    const bytes = new Uint8Array(256).map((_, i) => i)
    await sbx.files.write('bytes.bin', bytes.buffer)
    assert.deepEqual(await sbx.files.read('bytes.bin', { format: 'bytes' }), bytes)
    const big = new Uint8Array(1 << 20).map((_, i) => (i * 7 + 3) & 0xff)
    await sbx.files.write('big.bin', new Blob([big]))
    const back = await sbx.files.read('big.bin', { format: 'bytes' })
    assert.equal(back.length, big.length)
    assert.ok(Buffer.from(back).equals(Buffer.from(big)), '1 MiB round trip differs')
  })
  await step(`${label} signed downloadUrl and uploadUrl`, async () => {
    const down = await fetch(await sbx.downloadUrl('bytes.bin'))
    assert.equal(down.status, 200)
    assert.equal((await down.arrayBuffer()).byteLength, 256)
    const expiring = await fetch(await sbx.downloadUrl('bytes.bin', { useSignatureExpiration: 60 }))
    assert.equal(expiring.status, 200)
    const form = new FormData()
    form.append('file', new Blob(['uploaded']), 'up.txt')
    const up = await fetch(await sbx.uploadUrl('up.txt'), { method: 'POST', body: form })
    assert.equal(up.status, 200)
    assert.equal(await sbx.files.read('up.txt'), 'uploaded')
    const forged = new URL(await sbx.downloadUrl('bytes.bin'))
    forged.searchParams.set('path', 'big.bin')
    assert.equal((await fetch(forged)).status, 401)
  })
  await step(`${label} commands run, env, cwd, exit codes`, async () => {
    const r = await sbx.commands.run('echo out; echo err >&2; pwd; echo "$FOO-$BAR"; cat sub/dir/deep.txt', { envs: { BAR: 'cmd' } })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n/home/user\nbar-cmd\ndeep')
    assert.equal(r.stderr, 'err\n')
    // No root in a sandbox: a command asked to run as root runs as its
    // user, and the first says so on its stderr.
    const asRoot = await sbx.commands.run('id -u', { user: 'root' })
    assert.equal(asRoot.stdout, '1000\n')
    assert.match(asRoot.stderr, /^\[sandloop\] this sandbox has one user and no root: commands asked to run as "root" run as that user/)
    assert.equal((await sbx.commands.run('id -u', { user: 'root' })).stderr, '')
    const inDir = await sbx.commands.run('pwd', { cwd: '/workspace/sub' })
    assert.equal(inDir.stdout.trim(), '/workspace/sub')
    const failed = await throws(() => sbx.commands.run('echo partial; exit 3'))
    assert.equal(failed.name, 'CommandExitError')
    assert.equal(failed.exitCode, 3)
    assert.equal(failed.stdout, 'partial\n')
    const streamed = []
    await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => streamed.push(d) })
    assert.equal(streamed.join(''), '1\n2\n3\n')
  })
  await step(`${label} commands background, list, kill`, async () => {
    const h = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 0 })
    const pids = (await sbx.commands.list()).map((p) => p.pid)
    assert.ok(pids.includes(h.pid), `pid ${h.pid} not in ${pids}`)
    assert.equal(await sbx.commands.kill(h.pid), true)
    const res = await throws(() => h.wait())
    assert.equal(res.exitCode, -1)
    assert.equal(await sbx.commands.kill(h.pid), false)
    const left = (await sbx.commands.list()).map((p) => p.pid)
    assert.ok(!left.includes(h.pid))
  })
  await step(`${label} commands stdin`, async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'ping\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'ping\n')
  })
  await step(`${label} command timeout kills it`, async () => {
    const t0 = Date.now()
    await throws(() => sbx.commands.run('sleep 30', { timeoutMs: 1000 }))
    // The client gives up at the same moment the server kills it: allow a moment.
    while ((await sbx.commands.list()).length > 0 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 100))
    assert.equal((await sbx.commands.list()).length, 0)
  })
  await step(`${label} getInfo and list by metadata`, async () => {
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.metadata.run, run)
    assert.equal(info.state, 'running')
    const ids = await listIDs(Sandbox, { run })
    assert.deepEqual(ids, [sbx.sandboxId])
    assert.deepEqual(await listIDs(Sandbox, { run: 'no such run' }), [])
  })
  await step(`${label} getMetrics`, async () => {
    const since = new Date()
    await sbx.commands.run('true')
    const all = await sbx.getMetrics()
    assert.ok(all.length >= 1, 'a sample is taken when asked')
    const m = all[all.length - 1]
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp.getTime()), `timestamp ${m.timestamp}`)
    const info = await sbx.getInfo()
    assert.equal(m.cpuCount, info.cpuCount)
    assert.equal(m.memTotal, info.memoryMB * 1024 * 1024)
    assert.ok(m.memUsed > 0 && m.diskTotal > 0 && m.cpuUsedPct >= 0, JSON.stringify(m))
    assert.ok((await sbx.getMetrics({ start: since })).length >= 1, 'the last sample is in a window from now')
    assert.deepEqual(await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(Date.now() + 3600e3) }), [])
  })
  await step(`${label} two sandboxes are isolated`, async () => {
    const other = await Sandbox.create({ metadata: { run, other: 'yes' } })
    try {
      assert.equal(await other.files.exists('bytes.bin'), false)
      const r = await other.commands.run('ls -A /workspace | wc -l')
      assert.equal(r.stdout.trim(), '0')
      await other.files.write('mine.txt', 'other')
      assert.equal(await sbx.files.exists('mine.txt'), false)
      assert.deepEqual(await listIDs(Sandbox, { run }), [sbx.sandboxId, other.sandboxId].sort())
      assert.deepEqual(await listIDs(Sandbox, { run, other: 'yes' }), [other.sandboxId])
    } finally {
      await other.kill()
    }
    assert.equal(await other.isRunning(), false)
    assert.equal(await Sandbox.kill(other.sandboxId), false)
  })
  await step(`${label} connect and setTimeout`, async () => {
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await again.files.exists('bytes.bin'), true)
    await sbx.setTimeout(60_000)
    const end = new Date((await sbx.getInfo()).endAt).getTime()
    assert.ok(end - Date.now() < 61_000 && end - Date.now() > 50_000, `endAt ${end - Date.now()} ms away`)
    await throws(() => Sandbox.connect('0123456789abcdef'), (e) => assert.equal(e.name, 'SandboxNotFoundError'))
  })
  await step(`${label} wrong key`, async () => {
    await throws(() => Sandbox.create({ apiKey: 'e2b_0123456789abcdef' }), (e) => assert.equal(e.name, 'AuthenticationError'))
  })
  await step(`${label} timeout reaper`, async () => {
    // Its time to live set once it is known running: a create slowed by
    // the load does not eat it.
    const short = await Sandbox.create({ timeoutMs: 60000 })
    assert.equal(await short.isRunning(), true)
    await short.setTimeout(1500)
    await new Promise((r) => setTimeout(r, 4000))
    assert.equal(await short.isRunning(), false)
  })
}

async function interpreter() {
  const { Sandbox } = await import('@e2b/code-interpreter')
  let sbx
  await step('create', async () => {
    sbx = await Sandbox.create({ envs: { FOO: 'bar' }, metadata: { run } })
  })
  try {
    await step('runCode keeps state', async () => {
      await sbx.runCode('x = 41')
      const e = await sbx.runCode('x + 1')
      assert.equal(e.text, '42')
      assert.equal(e.error, undefined)
    })
    await step('runCode streams stdout and sees sandbox env', async () => {
      const out = []
      const e = await sbx.runCode('import os\nprint("a")\nprint(os.environ["FOO"])', { onStdout: (m) => out.push(m.line) })
      assert.equal(e.logs.stdout.join(''), 'a\nbar\n')
      assert.equal(out.join(''), 'a\nbar\n')
    })
    await step('runCode per-cell envs', async () => {
      const e = await sbx.runCode('import os; os.environ.get("CELL")', { envs: { CELL: 'only here' } })
      assert.equal(e.text, "'only here'")
      assert.equal((await sbx.runCode('import os; str(os.environ.get("CELL"))')).text, "'None'")
    })
    await step('runCode matplotlib PNG', async () => {
      const e = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
      assert.equal(e.results.length, 1)
      assert.ok(Buffer.from(e.results[0].png, 'base64').subarray(1, 4).toString() === 'PNG')
    })
    await step('runCode html', async () => {
      const e = await sbx.runCode('class H:\n    def _repr_html_(self): return "<b>hi</b>"\nH()')
      assert.equal(e.results[0].html, '<b>hi</b>')
    })
    await step('runCode error', async () => {
      const e = await sbx.runCode('1/0')
      assert.equal(e.error.name, 'ZeroDivisionError')
      assert.equal(e.error.value, 'division by zero')
      assert.ok(e.error.traceback.includes('1/0'), e.error.traceback)
      assert.ok(!e.error.traceback.includes('kernel.py'), e.error.traceback)
    })
    await step('runCode timeout keeps state', async () => {
      // y set in a cell of its own: the 1.5 s start when the headers
      // arrive, which may be before a loaded kernel runs a line.
      await sbx.runCode('y = 5')
      await throws(() => sbx.runCode('import time\ntime.sleep(30)\ny = 6', { timeoutMs: 1500 }), (e) => assert.equal(e.name, 'TimeoutError'))
      const t0 = Date.now()
      const e = await sbx.runCode('y')
      assert.equal(e.text, '5')
      assert.ok(Date.now() - t0 < 10_000, 'the timed-out cell was not interrupted')
    })
    await step('contexts', async () => {
      const ctx = await sbx.createCodeContext({ cwd: '/workspace/ctxdir' })
      const e = await sbx.runCode('import os; z = 1; os.getcwd()', { context: ctx })
      assert.equal(e.text, "'/workspace/ctxdir'")
      assert.equal((await sbx.runCode('z', { context: ctx })).text, '1')
      assert.equal((await sbx.runCode('"z" in globals()')).text, 'False')
      const ids = (await sbx.listCodeContexts()).map((c) => c.id)
      assert.ok(ids.includes(ctx.id), ids.join(','))
      await sbx.restartCodeContext(ctx)
      assert.equal((await sbx.runCode('"z" in globals()', { context: ctx })).text, 'False')
      await sbx.removeCodeContext(ctx)
      assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(ctx.id))
    })
    await step('kernel, commands and files share /workspace', async () => {
      await sbx.runCode('open("from_kernel.txt", "w").write("k")')
      assert.equal(await sbx.files.read('from_kernel.txt'), 'k')
      assert.equal((await sbx.commands.run('cat from_kernel.txt')).stdout, 'k')
      await sbx.files.write('from_api.txt', 'api')
      assert.equal((await sbx.runCode('open("from_api.txt").read()')).text, "'api'")
    })
    await common(Sandbox, sbx, 'latest')
  } finally {
    await sbx.kill()
  }
  await step('killed sandbox', async () => {
    assert.equal(await sbx.isRunning(), false)
    await throws(() => sbx.runCode('1'))
  })
}

async function e2b245() {
  const { Sandbox } = await import('e2b-2.45')
  const sbx = await Sandbox.create({ envs: { FOO: 'bar' }, metadata: { run } })
  try {
    await common(Sandbox, sbx, '2.45')
  } finally {
    await sbx.kill()
  }
}

// bench alternates the SDK and sandloop's own API (create a session,
// execute, delete; token in SANDLOOP_TOKEN) so both see the same machine,
// each starting once the server's warm pool is full again.
async function bench(n, code) {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const base = process.env.E2B_API_URL
  const api = async (method, path, body) => {
    const r = await fetch(base + path, {
      method,
      headers: { Authorization: `Bearer ${process.env.SANDLOOP_TOKEN}`, 'Content-Type': 'application/json' },
      body: body && JSON.stringify(body),
    })
    if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${await r.text()}`)
    return r.status === 204 ? null : r.json()
  }
  const full = (await api('GET', '/healthz')).pool_ready
  const settle = async () => {
    for (let t = Date.now(); Date.now() - t < 5000; await new Promise((r) => setTimeout(r, 20))) {
      if ((await api('GET', '/healthz')).pool_ready >= full) return
    }
  }
  const sdk = []
  const native = []
  for (let i = 0; i < n; i++) {
    await settle()
    let t0 = performance.now()
    const sbx = await Sandbox.create()
    const e = await sbx.runCode(code)
    sdk.push(performance.now() - t0)
    assert.equal(e.text, '2')
    await sbx.kill()
    await settle()
    t0 = performance.now()
    const s = await api('POST', '/v1/sessions', {})
    const r = await api('POST', `/v1/sessions/${s.id}/execute`, { code })
    native.push(performance.now() - t0)
    assert.equal(r.results[0].data['text/plain'], '2')
    await api('DELETE', `/v1/sessions/${s.id}`)
  }
  const median = (a) => a.sort((x, y) => x - y)[Math.floor(a.length / 2)]
  console.log(JSON.stringify({ sdk_ms: median(sdk), native_ms: median(native), runs: n, pool: full }))
}

// computesdk measures as the public ComputeSDK benchmark does: the time
// from Sandbox.create() to the first command's answer (it runs `node -v`;
// here `python3 -V`, which every sandbox has), sequentially, staggered 200
// ms apart and in a burst; the sandboxes are killed after, untimed.
// why says what a failure was: a command's exit code, error and stderr
// with the error's name (String of a CommandExitError is its name alone).
function why(e) {
  if (e && e.name === 'CommandExitError') {
    return `CommandExitError: exit ${e.exitCode}${e.error ? ` (${e.error})` : ''}, stdout ${JSON.stringify(String(e.stdout).slice(0, 200))}, stderr ${JSON.stringify(String(e.stderr).slice(0, 300))}`
  }
  return String(e)
}

async function computesdk(n, burst) {
  const { Sandbox } = await import('e2b')
  const creates = [] // Sandbox.create() alone, sequentially
  const one = async (alone) => {
    const t0 = performance.now()
    const sbx = await Sandbox.create()
    if (alone) creates.push(performance.now() - t0)
    try {
      const r = await sbx.commands.run('python3 -V')
      assert.match(r.stdout + r.stderr, /^Python 3\./)
      return performance.now() - t0
    } finally {
      await sbx.kill()
    }
  }
  const stats = (name, times, failures) => {
    const s = [...times].sort((x, y) => x - y)
    const at = (p) => (s.length ? s[Math.min(s.length - 1, Math.ceil((s.length * p) / 100) - 1)] : null)
    return { name, n: s.length, failures: failures.length, first_error: failures[0], median_ms: at(50), p95_ms: at(95), p99_ms: at(99) }
  }
  const settled = async (promises) => {
    const rs = await Promise.allSettled(promises)
    return [rs.filter((r) => r.status === 'fulfilled').map((r) => r.value), rs.filter((r) => r.status === 'rejected').map((r) => why(r.reason))]
  }
  const out = []
  const seq = []
  const seqFail = []
  for (let i = 0; i < n; i++) {
    try {
      seq.push(await one(true))
    } catch (e) {
      seqFail.push(why(e))
    }
  }
  out.push(stats('sequential', seq, seqFail))
  out.push(stats('sequential, Sandbox.create() alone', creates, []))
  const staggered = []
  for (let i = 0; i < n; i++) {
    const p = one()
    // Handled now, counted by settled below: a create refused while the
    // loop still sleeps (the old pipeline falling behind: 429) is a
    // failure of its own, not an unhandled rejection that ends the run.
    p.catch(() => {})
    staggered.push(p)
    await new Promise((r) => setTimeout(r, 200))
  }
  out.push(stats('staggered', ...(await settled(staggered))))
  out.push(stats('burst', ...(await settled(Array.from({ length: burst }, () => one())))))
  // The same burst again once the server's warm pool has refilled to the
  // target it set itself (its /healthz; at most 2 minutes), as RL rollouts
  // and evaluation runs send bursts of one size again and again.
  const ended = performance.now()
  let pool = {}
  while (performance.now() - ended < 120000) {
    const r = await fetch(`${process.env.E2B_API_URL}/healthz`)
    pool = await r.json()
    if (pool.pool_ready >= pool.pool_target) break
    await new Promise((r) => setTimeout(r, 20))
  }
  const gap = performance.now() - ended
  const again = stats('repeated-burst', ...(await settled(Array.from({ length: burst }, () => one()))))
  again.after_ms = gap
  again.pool_target = pool.pool_target
  out.push(again)
  console.log(JSON.stringify(out))
}

// firstcommand is computesdk's sequential part, with the wall-clock time
// of each stage, for cmd/sandloop's BenchmarkE2BFirstCommand to put beside
// the server's trace of the same commands.
async function firstcommand(n, cmd) {
  const { Sandbox } = await import('e2b')
  const now = () => performance.timeOrigin + performance.now()
  const out = []
  for (let i = 0; i < n; i++) {
    const t0 = now()
    const sbx = await Sandbox.create()
    const created = now()
    let firstStdout = 0
    try {
      const r = await sbx.commands.run(cmd, {
        onStdout: () => {
          if (!firstStdout) firstStdout = now()
        },
      })
      const resolved = now()
      assert.equal(r.exitCode, 0)
      out.push({ sandbox: sbx.sandboxId, t0, created, first_stdout: firstStdout, resolved })
    } finally {
      await sbx.kill()
    }
  }
  console.log(JSON.stringify(out))
}

// burst is issue 26's measure through E2B's code-interpreter SDK: n
// creates + runCode('1+1') at once, then (the sandboxes killed) the same
// once the server's pool has refilled to the target it set itself.
async function burst(n, repeat, pauseMs) {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const dc = await import('node:diagnostics_channel')
  let connects = 0 // connections undici opened (the SDK's own and Node's fetch)
  dc.subscribe('undici:client:connected', () => connects++)
  const one = async () => {
    const t0 = performance.now()
    const sbx = await Sandbox.create()
    const created = performance.now()
    try {
      const e = await sbx.runCode('1+1')
      assert.equal(e.text, '2')
      const end = performance.now()
      return [end - t0, sbx, created - t0, end - created]
    } catch (err) {
      await sbx.kill()
      throw err
    }
  }
  const round = async (name) => {
    const cpu0 = cpuTimes()
    const c0 = connects
    const t0 = performance.now()
    const rs = await Promise.allSettled(Array.from({ length: n }, one))
    const end = performance.now()
    const cpu = cpuSince(cpu0)
    const conns = connects - c0
    const ok = rs.filter((r) => r.status === 'fulfilled').map((r) => r.value)
    const failures = rs.filter((r) => r.status === 'rejected').map((r) => why(r.reason))
    await Promise.all(ok.map(([, sbx]) => sbx.kill()))
    const sorted = (i) => ok.map((v) => v[i]).sort((x, y) => x - y)
    const at = (s, p) => (s.length ? s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))] : null)
    const s = sorted(0)
    return { name, n: s.length, failures: failures.length, first_error: failures[0], p50_ms: at(s, 50), p95_ms: at(s, 95),
      last_ms: s.length ? s[s.length - 1] : null, per_second: (s.length * 1000) / (end - t0), end,
      create_p50_ms: at(sorted(2), 50), run_p50_ms: at(sorted(3), 50), connections: conns, ...cpu }
  }
  const poolFull = async () => {
    let pool = {}
    for (const t0 = performance.now(); performance.now() - t0 < 120000; await new Promise((r) => setTimeout(r, 20))) {
      pool = await (await fetch(`${process.env.E2B_API_URL}/healthz`)).json()
      if (pool.pool_ready >= pool.pool_target) break
    }
    return pool
  }
  // The SDK's first calls load and compile its code: two sandboxes one
  // after the other (no more than the server's pool of 2, so its target
  // stays) before the first round, which starts with the pool full.
  for (let i = 0; i < 2; i++) {
    const [, sbx] = await one()
    await sbx.kill()
  }
  await poolFull()
  const first = await round('first')
  if (!repeat) {
    console.log(JSON.stringify([first]))
    return
  }
  const pool = await poolFull()
  const wait = pauseMs - (performance.now() - first.end)
  if (wait > 0) await new Promise((r) => setTimeout(r, wait))
  const after = performance.now() - first.end
  const again = await round('repeated')
  again.after_ms = after
  again.pool_target = pool.pool_target
  console.log(JSON.stringify([first, again]))
}

// cpuTimes reads, for burst's figures, the CPU time so far of this
// process (the client), of the server (SERVER_PID, if set) and of every
// process under it (the zygote, its spares and the sessions' kernels and
// jails), and the whole machine's busy and total time (/proc/stat, all
// cores). Each process's time is the sum of its threads' run time in
// /proc/PID/task/TID/schedstat (ns): /proc/PID/stat counts whole ticks
// (10 ms), which a kernel that runs 1+1 never reaches. Linux only; the
// figures are omitted elsewhere.
function cpuTimes() {
  const out = { client: process.cpuUsage(), procs: new Map() }
  try {
    const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
    out.machine = { busy: f.reduce((a, b) => a + b, 0) - f[3] - f[4], total: f.reduce((a, b) => a + b, 0) }
  } catch {}
  if (!process.env.SERVER_PID) return out
  for (const d of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(d)) continue
    try {
      const t = fs.readFileSync(`/proc/${d}/stat`, 'utf8')
      let ns = 0
      for (const tid of fs.readdirSync(`/proc/${d}/task`)) ns += Number(fs.readFileSync(`/proc/${d}/task/${tid}/schedstat`, 'utf8').split(' ')[0])
      out.procs.set(d, { ppid: t.slice(t.lastIndexOf(')') + 2).split(' ')[1], ns })
    } catch {} // gone meanwhile
  }
  return out
}

// cpuSince is what the client, the server and the processes under it
// spent since cpuTimes() returned a, in ms, and the machine's busy share
// in % of all its cores. A process under the server that ended meanwhile
// is not counted (none do during a round: the sandboxes are killed after
// it), nor a thread that did.
function cpuSince(a) {
  const b = cpuTimes()
  const c = b.client.user + b.client.system - a.client.user - a.client.system
  const out = { client_cpu_ms: c / 1000 }
  if (a.machine && b.machine) out.machine_busy_pct = (100 * (b.machine.busy - a.machine.busy)) / Math.max(1, b.machine.total - a.machine.total)
  const server = process.env.SERVER_PID
  if (server && b.procs.has(server)) {
    const under = new Set([server])
    for (let grew = true; grew; ) {
      grew = false
      for (const [pid, p] of b.procs) if (!under.has(pid) && under.has(p.ppid)) under.add(pid), (grew = true)
    }
    let below = 0
    for (const pid of under) if (pid !== server) below += b.procs.get(pid).ns - (a.procs.get(pid)?.ns ?? 0)
    out.server_cpu_ms = (b.procs.get(server).ns - (a.procs.get(server)?.ns ?? 0)) / 1e6
    out.sandboxes_cpu_ms = below / 1e6
  }
  return out
}

// keepalive checks that a sandbox made pauseMs after the previous one
// reuses the connections the first opened (the API's and the code
// interpreter's), counted by undici's diagnostics channel, which both
// the SDK's own undici and Node's fetch publish to.
async function keepalive(pauseMs) {
  const dc = await import('node:diagnostics_channel')
  const { Sandbox } = await import('@e2b/code-interpreter')
  let connects = 0
  dc.subscribe('undici:client:connected', () => connects++)
  const one = async () => {
    const sbx = await Sandbox.create()
    try {
      assert.equal((await sbx.runCode('1+1')).text, '2')
    } finally {
      await sbx.kill()
    }
  }
  await step('keepalive: the first sandbox connects', async () => {
    await one()
    assert.ok(connects >= 2, `${connects} connections counted for the API and the code interpreter`)
  })
  await step(`keepalive: no new connection after ${pauseMs} ms idle`, async () => {
    await new Promise((r) => setTimeout(r, pauseMs))
    const before = connects
    await one()
    assert.equal(connects - before, 0, `${connects - before} new connections after ${pauseMs} ms idle`)
  })
}

// stdin drives commands started with `stdin: true`, which hold a pipe the
// client never closes: their ends and kills must be reported at once, and
// killing or timing out a sandbox that holds one must not wait on it.
async function stdinCommands(marker) {
  const { Sandbox } = await import('e2b')
  const token = Buffer.from(process.env.E2B_API_KEY.slice(4), 'hex').toString()
  const sessionAlive = async (id) => {
    const r = await fetch(`${process.env.E2B_API_URL}/v1/sessions/${id}`, { headers: { Authorization: `Bearer ${token}` } })
    await r.body?.cancel()
    return r.status === 200
  }
  const timed = async (fn) => {
    const t0 = performance.now()
    const v = await fn()
    return [v, performance.now() - t0]
  }
  const stuck = `sh -c 'cat; : ${marker}-k'`
  const sbx = await Sandbox.create({ timeoutMs: 120000, metadata: { run } })
  try {
    await step('stdin: an exited command is reported at once', async () => {
      await sbx.commands.run('true') // warm
      const [plain, tPlain] = await timed(() => sbx.commands.run('echo hi'))
      const [r, tStdin] = await timed(() => sbx.commands.run('echo hi', { stdin: true, timeoutMs: 10000 }))
      assert.equal(r.exitCode, 0)
      assert.equal(r.stdout, plain.stdout)
      console.log(`  echo: ${Math.round(tPlain)} ms without stdin, ${Math.round(tStdin)} ms with`)
      // A command given stdin once waited for its timeout (10 s) to be
      // reported: half of that tells a hang from a loaded machine.
      assert.ok(tStdin <= tPlain + 5000, `with stdin ${tStdin} ms, without ${tPlain} ms`)
      const err = await throws(() => sbx.commands.run('exit 3', { stdin: true, timeoutMs: 10000 }))
      assert.equal(err.exitCode, 3)
    })
    await step('stdin: input reaches the command, then it ends', async () => {
      const h = await sbx.commands.run('read line; echo "got $line"', { background: true, stdin: true })
      await h.sendStdin('hello\n')
      const r = await h.wait()
      assert.equal(r.stdout, 'got hello\n')
    })
    await step('stdin: kill() of a sleeping command is reported at once, not at its end', async () => {
      const h = await sbx.commands.run('sleep 60', { background: true, stdin: true })
      const [, t] = await timed(async () => {
        assert.equal(await h.kill(), true)
        await throws(() => h.wait())
      })
      console.log(`  kill + wait: ${Math.round(t)} ms`)
      assert.ok(t <= 10000, `${t} ms: the command runs for 60 s`)
      assert.equal((await sbx.commands.list()).length, 0)
    })
    await step('stdin: kill() of a sandbox holding a stuck command answers before the server gives up on its close (5 s)', async () => {
      await sbx.commands.run(stuck, { background: true, stdin: true })
      const [, t] = await timed(() => sbx.kill())
      console.log(`  sandbox kill: ${Math.round(t)} ms`)
      assert.ok(t <= 4000, `${t} ms`)
      assert.equal(await sessionAlive(sbx.sandboxId), false)
    })
  } finally {
    await sbx.kill().catch(() => {})
  }
  await step('stdin: a sandbox times out on time while another holds a stuck command', async () => {
    const holder = await Sandbox.create({ timeoutMs: 60000, metadata: { run } })
    await holder.commands.run(stuck, { background: true, stdin: true })
    await holder.setTimeout(1000) // once it holds the command (a slow start would outlive 1 s)
    const b = await Sandbox.create({ timeoutMs: 2000, metadata: { run } })
    const born = performance.now()
    await new Promise((r) => setTimeout(r, 3000 - (performance.now() - born)))
    assert.equal(await sessionAlive(holder.sandboxId), false, 'the holder outlived its timeout')
    assert.equal(await sessionAlive(b.sandboxId), false, 'a 2 s sandbox was still running 3 s after its creation')
  })
  // Left running for the caller: serve's SIGTERM must not wait on it.
  const left = await Sandbox.create({ timeoutMs: 600000, metadata: { run } })
  const h = await left.commands.run(`sh -c 'cat; : ${marker}-left'`, { background: true, stdin: true })
  // Attached to its stream until the server ends it: serve's shutdown must
  // not wait on a client either.
  console.log(`left ${left.sandboxId}`)
  const ended = await h.wait().then((r) => `exit ${r.exitCode}`, (e) => `${e?.name}`)
  console.log(`left command ended: ${ended}`)
}

async function waitState(Sandbox, id, state, ms) {
  const end = Date.now() + ms
  for (;;) {
    const info = await Sandbox.getInfo(id)
    if (info.state === state) return info
    if (Date.now() > end) throw new Error(`state ${info.state} after ${ms} ms, want ${state}`)
    await new Promise((r) => setTimeout(r, 200))
  }
}

async function lifecycle() {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const sbx = await Sandbox.create({ metadata: { run } })
  try {
    await step('pause keeps the variables, connect resumes', async () => {
      await sbx.runCode('x = 41\nimport threading, time\nticks = [0]\ndef tick():\n    while True:\n        ticks[0] += 1\n        time.sleep(0.01)\nthreading.Thread(target=tick, daemon=True).start()')
      assert.equal(await sbx.pause(), true)
      assert.equal(await sbx.pause(), false, 'a second pause is "already paused"')
      assert.equal(await sbx.betaPause(), false)
      assert.equal((await sbx.getInfo()).state, 'paused')
      const listed = []
      const pager = Sandbox.list({ query: { metadata: { run } } })
      while (pager.hasNext) for (const s of await pager.nextItems()) listed.push(`${s.sandboxId}:${s.state}`)
      assert.deepEqual(listed, [`${sbx.sandboxId}:paused`])
      await throws(() => sbx.runCode('x'), (e) => assert.match(String(e?.message), /409|paused/))
      const same = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await same.getInfo()).state, 'running')
      assert.equal((await same.runCode('x + 1')).text, '42')
      // The old handle keeps its tokens (sbx.connect() throws the answer away).
      assert.equal((await sbx.runCode('x')).text, '41')
      const t = (await sbx.runCode('import time; a = ticks[0]; time.sleep(0.3); ticks[0] > a')).text
      assert.equal(t, 'True', 'the background thread goes on after resuming')
    })
    await step('Sandbox.pause(id), sbx.connect()', async () => {
      assert.equal(await Sandbox.pause(sbx.sandboxId), true)
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
      assert.equal(await sbx.connect(), sbx)
      assert.equal((await sbx.runCode('x')).text, '41')
      assert.equal(await sbx.connect(), sbx, 'connect to a running sandbox')
      await throws(() => Sandbox.pause('nosuchsandbox'), (e) => assert.equal(e?.name, 'SandboxNotFoundError'))
    })
  } finally {
    await sbx.kill()
  }
  await step("onTimeout 'pause' with autoResume", async () => {
    // Created long, shortened once the cell ran (a slow first cell is not
    // paused); a resume gives it its time to live again, the create's.
    const s = await Sandbox.create({ timeoutMs: 60000, lifecycle: { onTimeout: 'pause', autoResume: true }, metadata: { run } })
    try {
      await s.runCode('y = 5')
      await s.setTimeout(2000)
      const info = await waitState(Sandbox, s.sandboxId, 'paused', 20000)
      assert.equal(info.lifecycle?.onTimeout, 'pause')
      assert.equal(info.lifecycle?.autoResume, true)
      assert.equal((await s.runCode('y')).text, '5', 'a request resumes it')
      assert.equal((await s.getInfo()).state, 'running')
    } finally {
      await s.kill()
    }
  })
  await step("onTimeout 'pause' without autoResume", async () => {
    const s = await Sandbox.create({ timeoutMs: 60000, lifecycle: { onTimeout: 'pause' }, metadata: { run } })
    try {
      await s.runCode('z = 6')
      await s.setTimeout(2000) // once the cell ran: a slow first cell is not paused
      await waitState(Sandbox, s.sandboxId, 'paused', 20000)
      await throws(() => s.runCode('z'))
      await new Promise((r) => setTimeout(r, 1000))
      assert.equal((await Sandbox.getInfo(s.sandboxId)).state, 'paused', 'a paused sandbox outlives its time to live')
      const again = await Sandbox.connect(s.sandboxId, { timeoutMs: 60000 })
      assert.equal((await again.runCode('z')).text, '6')
    } finally {
      await s.kill()
    }
  })
  await step('kill a paused sandbox', async () => {
    const s = await Sandbox.create({ metadata: { run } })
    await s.pause()
    assert.equal(await s.kill(), true)
    await throws(() => Sandbox.connect(s.sandboxId), (e) => assert.equal(e?.name, 'SandboxNotFoundError'))
  })
  await step('what sandloop lacks (volumes, secrets, the MCP gateway) is refused, saying so, never ignored', async () => {
    const { Volume, Secret } = await import('e2b')
    await throws(() => Volume.create('data'), (e) => assert.match(String(e?.message), /volumes are not implemented/))
    await throws(() => Secret.create('token', 'value'), (e) => assert.match(String(e?.message), /secrets are not implemented/))
    await throws(() => Sandbox.create({ volumeMounts: { '/data': 'data' }, metadata: { run } }),
      (e) => assert.match(String(e?.message), /volumeMounts: volumes are not implemented/))
    await throws(() => Sandbox.create({ mcp: { exa: { apiKey: 'k' } }, metadata: { run } }),
      (e) => assert.match(String(e?.message), /mcp: E2B's MCP gateway/))
    const left = []
    const pager = Sandbox.list({ query: { metadata: { run } } })
    while (pager.hasNext) for (const s of await pager.nextItems()) left.push(s.sandboxId)
    assert.deepEqual(left, [], 'a refused create leaves no sandbox')
  })
}

async function fork() {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const sbx = await Sandbox.create({ metadata: { run } })
  const made = []
  try {
    await step('sbx.fork({count: 2}): variables and files carried, each diverges alone', async () => {
      await sbx.runCode('x = 41')
      await sbx.files.write('f.txt', 'parent')
      const forks = await sbx.fork({ count: 2, timeoutMs: 60000 })
      assert.equal(forks.length, 2)
      for (const f of forks) {
        assert.ok(f instanceof Sandbox, `a fork is a Sandbox with runCode, not ${f}`)
        assert.notEqual(f.sandboxId, sbx.sandboxId)
        made.push(f)
      }
      assert.equal((await forks[0].runCode('x += 1\nx')).text, '42')
      await forks[0].files.write('f.txt', 'fork')
      assert.equal((await forks[1].runCode('x')).text, '41', 'a sibling does not see the change')
      assert.equal(await forks[1].files.read('f.txt'), 'parent')
      assert.equal((await sbx.runCode('x')).text, '41', 'the source does not see it')
      assert.equal(await sbx.files.read('f.txt'), 'parent')
      const out = await forks[0].commands.run('cat f.txt')
      assert.equal(out.stdout, 'fork')
      const info = await forks[0].getInfo()
      assert.equal(info.state, 'running')
      assert.ok(info.endAt.getTime() - Date.now() <= 60000, 'its own time to live')
    })
    await step('Sandbox.fork(id) with the default count', async () => {
      const [f] = await Sandbox.fork(sbx.sandboxId)
      assert.ok(f instanceof Sandbox)
      made.push(f)
      assert.equal((await f.runCode('x')).text, '41')
    })
    await step('fork of a paused or unknown sandbox fails', async () => {
      await throws(() => Sandbox.fork('nosuchsandbox'), (e) => assert.equal(e?.name, 'SandboxNotFoundError'))
      assert.equal(await sbx.pause(), true)
      await throws(() => sbx.fork(), (e) => assert.match(String(e?.message), /paused|resume/))
      await sbx.connect()
      await throws(() => sbx.fork({ count: 101 }), (e) => assert.match(String(e?.message), /count/))
    })
  } finally {
    for (const f of made) await f.kill()
    await sbx.kill()
  }
}

async function snapshots() {
  const { Sandbox } = await import('@e2b/code-interpreter')
  const sbx = await Sandbox.create({ metadata: { run } })
  const made = []
  let named, plain
  try {
    await step('sbx.createSnapshot(): 201 {snapshotId, names}', async () => {
      await sbx.runCode('x = 41\ngen = (i for i in [1])')
      await sbx.files.write('f.txt', 'snap')
      plain = await sbx.createSnapshot()
      assert.match(plain.snapshotId, /^snap-/)
      assert.deepEqual(plain.names, [])
      named = await sbx.createSnapshot({ name: `named-${run}` })
      assert.deepEqual(named.names, [`named-${run}`])
      assert.equal((await sbx.runCode('x')).text, '41', 'the source keeps running')
    })
    await step('Sandbox.create(snapshotId): files and variables back', async () => {
      await sbx.files.write('f.txt', 'changed after')
      const s = await Sandbox.create(plain.snapshotId, { metadata: { run } })
      made.push(s)
      assert.equal((await s.runCode('x + 1')).text, '42')
      assert.equal(await s.files.read('f.txt'), 'snap')
      await throws(() => Sandbox.create('snap-nosuchsnapshot0'), (e) => assert.match(String(e?.message), /404|not found/))
    })
    await step('listSnapshots: all, by sandbox, by name, paged', async () => {
      const all = []
      const pager = Sandbox.listSnapshots({ limit: 1 })
      while (pager.hasNext) all.push(...await pager.nextItems())
      const ids = all.map((x) => x.snapshotId)
      assert.ok(ids.includes(plain.snapshotId) && ids.includes(named.snapshotId), `listed ${ids}`)
      const mine = await sbx.listSnapshots().nextItems()
      assert.deepEqual(mine.map((x) => x.snapshotId).sort(), [plain.snapshotId, named.snapshotId].sort())
      const byName = await Sandbox.listSnapshots({ name: `named-${run}` }).nextItems()
      assert.deepEqual(byName.map((x) => x.snapshotId), [named.snapshotId])
    })
    await step('deleteSnapshot: true, then false', async () => {
      assert.equal(await Sandbox.deleteSnapshot(plain.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(plain.snapshotId), false)
      assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), true)
      await throws(() => Sandbox.createSnapshot('nosuchsandbox'), (e) => assert.equal(e?.name, 'SandboxNotFoundError'))
    })
  } finally {
    for (const s of made) await s.kill()
    await sbx.kill()
  }
}

switch (mode) {
  case 'snapshots':
    await snapshots()
    break
  case 'fork':
    await fork()
    break
  case 'interpreter':
    await interpreter()
    break
  case 'e2b-2.45':
    await e2b245()
    break
  case 'lifecycle':
    await lifecycle()
    break
  case 'stdin':
    await stdinCommands(process.argv[3] || 'sandloop-stdin')
    break
  case 'bench':
    await bench(Number(process.argv[3] || 10), process.argv[4] || '1+1')
    break
  case 'firstcommand':
    await firstcommand(Number(process.argv[3] || 100), process.argv[4] || 'python3 -V')
    break
  case 'keepalive':
    await keepalive(Number(process.argv[3] || 5000))
    break
  case 'burst':
    await burst(Number(process.argv[3] || 100), process.argv[4] !== 'once', Number(process.argv[5] || 0))
    break
  case 'computesdk':
    await computesdk(Number(process.argv[3] || 100), Number(process.argv[4] || 64))
    break
  default:
    console.error('usage: node e2e.mjs interpreter|e2b-2.45|lifecycle|fork|snapshots|stdin MARKER|bench N|keepalive MS|burst N [once]|computesdk N BURST|firstcommand N CMD')
    process.exit(2)
}
console.log('done')
// Idle keep-alive sockets of the SDKs' HTTP clients would hold node for a minute.
process.exit(0)
