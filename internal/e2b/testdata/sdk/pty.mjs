// A terminal through E2B's SDK (e2b latest), unchanged: sbx.pty.create runs
// `bash -i -l` on a pseudo-terminal; an interactive python3 is typed into it.
//
//   node pty.mjs MARKER   MARKER is in python3's command line (-X MARKER), so
//                         the caller can check that no process is left behind
//
// Each step prints "ok <step>"; a failure prints the error and exits 1; the
// end prints "done".
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const marker = process.argv[2]
assert.ok(marker, 'usage: node pty.mjs MARKER')

async function step(name, fn) {
  const t0 = performance.now()
  try {
    await fn()
    console.log(`ok ${name} (${Math.round(performance.now() - t0)} ms)`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e?.name}: ${e?.message}`)
    console.log(e?.stack)
    console.log(`the terminal showed: ${JSON.stringify(screen)}`)
    process.exit(1)
  }
}

// waitShown waits until what the terminal showed since `from` matches re.
async function waitShown(re, from, ms = 30000) {
  const end = Date.now() + ms
  while (Date.now() < end) {
    const m = re.exec(screen.slice(from))
    if (m) return from + m.index + m[0].length
    await new Promise((r) => setTimeout(r, 20))
  }
  throw new Error(`no ${re} on the terminal after ${ms} ms`)
}

let screen = ''
const decoder = new TextDecoder()
const enc = (s) => new TextEncoder().encode(s)
const sbx = await Sandbox.create()
let term
let at = 0

await step('pty.create runs an interactive bash', async () => {
  term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { screen += decoder.decode(d, { stream: true }) } })
  assert.ok(term.pid > 0)
  at = await waitShown(/\$ $/, 0)
})

await step('sendInput: python3 -q answers print(6*7) with 42', async () => {
  await sbx.pty.sendInput(term.pid, enc(`python3 -q -X ${marker}\n`))
  at = await waitShown(/>>> $/, at)
  await sbx.pty.sendInput(term.pid, enc('print(6*7)\n'))
  at = await waitShown(/print\(6\*7\)\r\n42\r\n>>> $/, at)
})

await step('resize: the program sees the new size', async () => {
  await sbx.pty.resize(term.pid, { cols: 123, rows: 45 })
  await sbx.pty.sendInput(term.pid, enc("import os; print('size', tuple(os.get_terminal_size()))\n"))
  at = await waitShown(/\r\nsize \(123, 45\)\r\n/, at)
})

await step('commands.list shows the PTY', async () => {
  const ps = await sbx.commands.list()
  const p = ps.find((p) => p.pid === term.pid)
  assert.ok(p, `pid ${term.pid} not in ${JSON.stringify(ps)}`)
  assert.equal(p.cmd, '/bin/bash')
  assert.deepEqual(p.args, ['-i', '-l'])
})

await step('kill ends it and the stream reports it', async () => {
  assert.equal(await sbx.pty.kill(term.pid), true)
  await assert.rejects(term.wait(), (e) => e instanceof CommandExitError && e.exitCode === -1)
  assert.equal(await sbx.pty.kill(term.pid), false)
  const ps = await sbx.commands.list()
  assert.ok(!ps.some((p) => p.pid === term.pid), 'still listed after kill')
})

await step('the stream deadline (timeoutMs) ends the PTY', async () => {
  const short = await sbx.pty.create({ cols: 80, rows: 24, timeoutMs: 1500, onData: () => {} })
  await assert.rejects(short.wait())
  // The client gives up at the deadline as the server kills it: allow the kill a moment.
  const end = Date.now() + 10000
  while ((await sbx.commands.list()).some((p) => p.pid === short.pid)) {
    assert.ok(Date.now() < end, 'still listed 10 s after its deadline')
    await new Promise((r) => setTimeout(r, 50))
  }
})

await step('sandbox kill', async () => {
  await sbx.kill()
})
console.log('done')
