// The harness of the framework scripts: each check prints one JSON line,
// {"check": name, "ok": true} or {"check": name, "ok": false, "error": why},
// which internal/e2b's frameworks test reports as a subtest. A failed check
// does not stop the script: later checks still run and report.
import assert from 'node:assert/strict'

export { assert }

// The marker the Go test looks for among the host's processes afterwards:
// every long-lived command a script starts carries it as an argument.
export const marker = process.env.FW_MARKER || 'sandloop-fw'

const timeoutMs = Number(process.env.FW_CHECK_TIMEOUT_MS || 90000)
let failed = 0

// check runs fn as the check called name, within the check timeout.
export async function check(name, fn) {
  let timer
  try {
    await Promise.race([
      fn(),
      new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`no answer in ${timeoutMs} ms`)), timeoutMs) }),
    ])
    console.log(JSON.stringify({ check: name, ok: true }))
  } catch (e) {
    failed++
    let msg = `${e?.name ?? 'Error'}: ${e?.message ?? e}`
    if (e?.details) msg += ` ${JSON.stringify(e.details)}`
    if (e?.cause?.message) msg += ` (cause: ${e.cause.message})`
    msg = msg.slice(0, 1500)
    console.log(JSON.stringify({ check: name, ok: false, error: msg }))
    if (process.env.FW_DEBUG) console.error(e?.stack)
  } finally {
    clearTimeout(timer)
  }
}

// done ends the script: exit 0 whatever failed (each check reported itself).
export function done() {
  console.log(JSON.stringify({ done: true, failed }))
  process.exit(0)
}

// model is what the scripted model (the Go test's OpenAI-compatible
// server) needs: its base URL, ending in /v1, and a key.
// Without it a framework would call the real provider: refuse to run.
if (!process.env.OPENAI_BASE_URL || !process.env.E2B_API_URL) {
  console.error('set OPENAI_BASE_URL (the scripted model) and E2B_API_URL (sandloop): nothing may leave the loopback')
  process.exit(2)
}
export const model = {
  baseURL: process.env.OPENAI_BASE_URL,
  apiKey: process.env.OPENAI_API_KEY || 'test',
  name: 'gpt-4.1-mini',
}

// call is a user message the scripted model obeys: it calls each tool in
// order, one per turn, then answers "RESULT " and the last tool's output.
export function call(...calls) {
  return calls.map(([tool, args]) => `CALL ${tool} ${JSON.stringify(args)}`).join('\n')
}

// api sends a request to sandloop's E2B control plane.
export async function api(method, path, body) {
  const r = await fetch(process.env.E2B_API_URL + path, {
    method,
    headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await r.text()
  let json
  try { json = JSON.parse(text) } catch { json = undefined }
  return { status: r.status, json, text }
}

// sandboxState is a sandbox's state ("running", "paused") from the
// control plane, or the HTTP status if it has none.
export async function sandboxState(id) {
  const r = await api('GET', `/sandboxes/${id}`)
  return r.status === 200 ? r.json.state : `HTTP ${r.status}`
}
