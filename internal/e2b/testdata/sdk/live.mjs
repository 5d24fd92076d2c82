// Drives updateNetwork and files.watchDir of a running sandloop server with
// E2B's official SDKs, unchanged (E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY point them at it); run by package e2b's TestSDKNetworkAndWatch.
//
//   node live.mjs network SITE CA_FILE  a cell fetches https://SITE/ (a test site the server resolves to
//                                       loopback): refused, allowed by updateNetwork, refused again;
//                                       getInfo reports the network; E2B's validation errors
//   node live.mjs watch                 watchDir sees what runCode and the files API write, recursive
//                                       and not; stop() drops the watcher; errors
//   node live.mjs onebox MARK           one sandbox: a server a background command started answers
//                                       runCode; /tmp and /home/user shared by the files API, commands
//                                       and runCode; `nohup sleep MARK &` outlives its command
//   node live.mjs metrics               getMetrics: a sample a second; memUsed grows by the 150 MiB the
//                                       kernel allocates; the window asked for is honoured
//
// Each step prints "ok <step>"; a failure prints the error and exits 1.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { Sandbox } from '@e2b/code-interpreter'
import { ALL_TRAFFIC, FilesystemEventType } from 'e2b'

const mode = process.argv[2]

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

async function until(what, cond, ms = 10000, poll) {
  const end = Date.now() + ms
  if (poll) await poll()
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, poll ? 500 : 50))
    if (poll) await poll()
  }
}

async function network(site, caFile) {
  const sbx = await Sandbox.create({ timeoutMs: 120000 })
  try {
    await sbx.files.write('ca.pem', readFileSync(caFile, 'utf8'))
    const fetchSite = async () => {
      const e = await sbx.runCode(
        `import urllib.request\ntry:\n    print(urllib.request.urlopen("https://${site}/", timeout=20).read().decode())\nexcept Exception as e:\n    print(e)`,
        { envs: { SSL_CERT_FILE: '/workspace/ca.pem' } },
      )
      return e.logs.stdout.join('').trim()
    }
    await step('network: a new sandbox reaches nothing here', async () => {
      const got = await fetchSite()
      assert.match(got, /403 sandloop: egress to .* is not allowed; allowed: nothing/)
      const info = await sbx.getInfo()
      assert.equal(info.allowInternetAccess, true)
    })
    await step('network: updateNetwork lets the running kernel reach the site', async () => {
      await sbx.updateNetwork({ allowOut: [site, '127.0.0.1'], denyOut: [ALL_TRAFFIC] })
      assert.equal(await fetchSite(), 'hello from the site')
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.network.allowOut, [site, '127.0.0.1'])
      assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])
      assert.equal(info.allowInternetAccess, false)
    })
    await step('network: an update replaces the rules (static form, allowInternetAccess)', async () => {
      await Sandbox.updateNetwork(sbx.sandboxId, { allowOut: ['127.0.0.1'], allowInternetAccess: false })
      assert.match(await fetchSite(), /403 sandloop: egress to .* is not allowed; allowed: 127\.0\.0\.1/)
      await sbx.updateNetwork({})
      assert.match(await fetchSite(), /allowed: nothing/)
    })
    await step("network: E2B's validation errors", async () => {
      await throws(() => sbx.updateNetwork({ denyOut: ['example.com'] }), (e) => {
        assert.equal(e.name, 'SandboxError')
        assert.match(e.message, /400: invalid denied CIDR "example.com"/)
      })
      await throws(() => sbx.updateNetwork({ allowOut: ['site.invalid'] }), (e) => assert.match(e.message, /400: allowOut lists domains/))
      await throws(() => Sandbox.updateNetwork('nope', {}), (e) => assert.equal(e.name, 'SandboxNotFoundError'))
    })
    await step('network: create with a network', async () => {
      const b = await Sandbox.create({ timeoutMs: 60000, network: { allowOut: [site, '127.0.0.1'], denyOut: [ALL_TRAFFIC] } })
      try {
        await b.files.write('ca.pem', readFileSync(caFile, 'utf8'))
        const e = await b.runCode(`import urllib.request\nprint(urllib.request.urlopen("https://${site}/", timeout=20).read().decode())`, { envs: { SSL_CERT_FILE: '/workspace/ca.pem' } })
        assert.equal(e.logs.stdout.join('').trim(), 'hello from the site')
        // A command goes out the same way, through the sandbox's allowlist.
        const c = await b.commands.run(`python3 -c 'import urllib.request; print(urllib.request.urlopen("https://${site}/", timeout=20).read().decode())'`, { envs: { SSL_CERT_FILE: '/home/user/ca.pem' } })
        assert.equal(c.stdout.trim(), 'hello from the site')
      } finally {
        await b.kill()
      }
    })
  } finally {
    await sbx.kill().catch(() => {})
  }
}

async function watch() {
  const sbx = await Sandbox.create({ timeoutMs: 120000 })
  try {
    await step('watch: runCode writes are reported, recursive', async () => {
      const events = []
      const h = await sbx.files.watchDir('/workspace', (e) => events.push(`${e.type} ${e.name}`), { recursive: true })
      await sbx.runCode("import os\nos.makedirs('out', exist_ok=True)\nopen('out/result.csv', 'w').write('a,b\\n1,2\\n')")
      await until('the file runCode wrote', () => events.includes(`${FilesystemEventType.CREATE} out/result.csv`) || events.includes(`${FilesystemEventType.WRITE} out/result.csv`))
      assert.ok(events.includes(`${FilesystemEventType.CREATE} out`), events.join(', '))
      await sbx.files.write('out/from-api.txt', 'x')
      await until('the files API write', () => events.includes(`${FilesystemEventType.WRITE} out/from-api.txt`) || events.includes(`${FilesystemEventType.CREATE} out/from-api.txt`))
      await sbx.runCode("os.rename('out/result.csv', 'out/final.csv')\nos.chmod('out/final.csv', 0o600)\nos.remove('out/from-api.txt')")
      await until('rename, chmod, remove', () =>
        [`${FilesystemEventType.RENAME} out/result.csv`, `${FilesystemEventType.CREATE} out/final.csv`, `${FilesystemEventType.CHMOD} out/final.csv`, `${FilesystemEventType.REMOVE} out/from-api.txt`].every((x) => events.includes(x)),
      )
      await h.stop()
      const n = events.length
      await sbx.runCode("open('after-stop.txt', 'w').write('x')")
      await new Promise((r) => setTimeout(r, 500))
      assert.equal(events.length, n, `events after stop(): ${events.slice(n).join(', ')}`)
    })
    await step('watch: not recursive sees only the directory itself', async () => {
      const events = []
      const h = await sbx.files.watchDir('out', (e) => events.push(`${e.type} ${e.name}`))
      await sbx.runCode("os.makedirs('out/deep', exist_ok=True)\nopen('out/deep/x.txt', 'w').write('x')\nopen('out/top.txt', 'w').write('x')")
      await until('out/top.txt', () => events.includes(`${FilesystemEventType.WRITE} top.txt`))
      assert.ok(events.includes(`${FilesystemEventType.CREATE} deep`), events.join(', '))
      assert.ok(!events.some((e) => e.includes('x.txt')), events.join(', '))
      await h.stop()
    })
    await step('watch: errors', async () => {
      await throws(() => sbx.files.watchDir('nope', () => {}), (e) => assert.equal(e.name, 'FileNotFoundError'))
      await sbx.files.write('plain.txt', 'x')
      await throws(() => sbx.files.watchDir('plain.txt', () => {}), (e) => assert.equal(e.name, 'InvalidArgumentError'))
      // includeEntry needs envd 0.6.3: the SDK refuses it before sending.
      await throws(() => sbx.files.watchDir('.', () => {}, { includeEntry: true }), (e) => assert.equal(e.name, 'TemplateError'))
    })
    await step('watch: the timeout ends the watch through onExit', async () => {
      let exit
      await sbx.files.watchDir('.', () => {}, { timeoutMs: 1000, onExit: (err) => (exit = err ?? 'none') })
      await until('onExit', () => exit !== undefined, 10000)
      assert.equal(exit?.name, 'TimeoutError', String(exit))
    })
  } finally {
    await sbx.kill().catch(() => {})
  }
}

async function onebox(mark) {
  const sbx = await Sandbox.create({ timeoutMs: 120000 })
  try {
    await step('onebox: a server a background command started answers runCode', async () => {
      await sbx.files.write('/home/user/index.html', 'served from the sandbox')
      const h = await sbx.commands.run('python3 -m http.server 8765 --bind 127.0.0.1', { background: true })
      assert.ok(h.pid > 0)
      const e = await sbx.runCode(
        `import time, urllib.request\nfor i in range(600):\n    try:\n        print(urllib.request.urlopen("http://127.0.0.1:8765/index.html", timeout=5).read().decode()); break\n    except OSError:\n        time.sleep(0.1)`,
      )
      assert.equal(e.logs.stdout.join('').trim(), 'served from the sandbox', JSON.stringify(e))
      await h.kill()
    })
    await step('onebox: /tmp is shared by the files API, commands and runCode', async () => {
      await sbx.files.write('/tmp/from-api.txt', 'written by files.write')
      const c = await sbx.commands.run('cat /tmp/from-api.txt; echo -n "written by a command" > /tmp/from-cmd.txt')
      assert.equal(c.stdout, 'written by files.write')
      const e = await sbx.runCode("print(open('/tmp/from-api.txt').read(), open('/tmp/from-cmd.txt').read(), sep='|')")
      assert.equal(e.logs.stdout.join('').trim(), 'written by files.write|written by a command')
      assert.equal(await sbx.files.read('/tmp/from-cmd.txt'), 'written by a command')
      const names = (await sbx.files.list('/tmp')).map((x) => x.path)
      assert.ok(names.includes('/tmp/from-api.txt'), names.join(', '))
      await throws(() => sbx.files.read('/etc/passwd'), (err) => assert.match(err.message, /reachable through the files API/))
    })
    await step('onebox: the home is /home/user, the workspace', async () => {
      const c = await sbx.commands.run('pwd; echo $HOME; cat index.html')
      assert.equal(c.stdout, '/home/user\n/home/user\nserved from the sandbox')
      const e = await sbx.runCode("print(open('/home/user/index.html').read() == open('index.html').read())")
      assert.equal(e.logs.stdout.join('').trim(), 'True')
    })
    await step('onebox: nohup ... & outlives its command, in the sandbox', async () => {
      const c = await sbx.commands.run(`nohup sleep ${mark} & echo $!`)
      const pid = Number(c.stdout.trim())
      assert.ok(pid > 0, c.stdout)
      const e = await sbx.runCode(`import os\nprint(open('/proc/${pid}/cmdline').read().split('\\0')[:2])`)
      assert.equal(e.logs.stdout.join('').trim(), `['sleep', '${mark}']`, JSON.stringify(e))
      const l = await sbx.commands.run(`ps -o args= -p ${pid} || cat /proc/${pid}/cmdline`)
      assert.match(l.stdout, new RegExp(mark))
    })
  } finally {
    await sbx.kill().catch(() => {})
  }
}

async function metrics() {
  const sbx = await Sandbox.create({ timeoutMs: 120000 })
  try {
    let before
    await step('metrics: samples a second apart, consistent with getInfo', async () => {
      let all = []
      await until('three samples', () => all.length >= 3, 30000, async () => (all = await sbx.getMetrics()))
      const info = await sbx.getInfo()
      for (const m of all) {
        assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp.getTime()), `timestamp ${m.timestamp}`)
        assert.equal(m.cpuCount, info.cpuCount)
        assert.equal(m.memTotal, info.memoryMB * 1024 * 1024)
        assert.ok(m.memUsed > 0, JSON.stringify(m))
      }
      const gaps = all.slice(1).map((m, i) => m.timestamp - all[i].timestamp)
      // The sampler ticks every second; a loaded machine may drop a tick (2 s), never more than a few.
      assert.ok(gaps.every((g) => g >= 900 && g <= 3100), `gaps ${gaps}`)
      assert.ok(gaps.filter((g) => g <= 1100).length * 2 >= gaps.length, `most gaps are a second: ${gaps}`)
      before = all[all.length - 1].memUsed
    })
    await step('metrics: memUsed grows when the kernel allocates 150 MiB', async () => {
      const e = await sbx.runCode("held = b'\\x01' * (150 << 20)\nprint(len(held) >> 20)")
      assert.equal(e.logs.stdout.join('').trim(), '150', JSON.stringify(e))
      const after = new Date()
      let grown
      await until('a sample with the 150 MiB', () => grown, 30000, async () => {
        grown = (await sbx.getMetrics({ start: after })).find((m) => m.memUsed >= before + (140 << 20))
      })
      assert.ok(grown.timestamp.getTime() >= after.getTime() - 2000, `${grown.timestamp} is in the window from ${after}`)
      const e2 = await sbx.runCode('del held')
      assert.equal(e2.error, undefined, JSON.stringify(e2))
    })
    await step('metrics: the window', async () => {
      const all = await sbx.getMetrics()
      const last = all[all.length - 1].timestamp
      assert.deepEqual(await sbx.getMetrics({ start: new Date(last.getTime() + 3600e3) }), [])
      const upTo = await Sandbox.getMetrics(sbx.sandboxId, { start: all[0].timestamp, end: all[1].timestamp })
      // The SDK rounds end to the nearest second and the server keeps a
      // second after it: a sample up to 1.5 s after the end asked for.
      assert.ok(upTo.length >= 1 && upTo.every((m) => m.timestamp.getTime() <= all[1].timestamp.getTime() + 1500), JSON.stringify(upTo))
    })
  } finally {
    await sbx.kill().catch(() => {})
  }
}

switch (mode) {
  case 'metrics':
    await metrics()
    break
  case 'onebox':
    await onebox(process.argv[3])
    break
  case 'network':
    await network(process.argv[3], process.argv[4])
    break
  case 'watch':
    await watch()
    break
  default:
    console.error('usage: node live.mjs network SITE CA_FILE | watch | onebox MARK | metrics')
    process.exit(2)
}
console.log('done')
process.exit(0)
