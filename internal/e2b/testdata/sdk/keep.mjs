// E2B sandboxes across a restart of `sandloop serve --keep-sessions`, with
// E2B's own SDK (@e2b/code-interpreter), unchanged:
//
//   node keep.mjs create          a sandbox (metadata, envs, a 10-minute timeout, a variable, a
//                                 file, a background command) and a paused one; prints
//                                 "ids RUNNING PAUSED"
//   node keep.mjs after RUNNING PAUSED
//                                 after the restart: getInfo (metadata, time to live, the paused
//                                 one still paused), connect + runCode on the same ids with the
//                                 variables, file and envs back; the command is reported ended
//   node keep.mjs again RUNNING   after another restart: connect + runCode once more, then kill
//
// A keeper's death (serve --keep-sessions --snapshot-every; TestKeepSessionsE2B/keeper-killed):
//
//   node keep.mjs kcreate         a sandbox (metadata, envs, a variable, a file written by the
//                                 files API, one by a cell) and a paused one; prints "ids ID PAUSED"
//   node keep.mjs kafter ID PAUSED
//                                 after the keeper's death, the same serve running: getInfo
//                                 (metadata), connect + runCode on the same id with the variable,
//                                 files and envs back, the first cell saying on stderr that the
//                                 sandbox was restored; the paused one is still paused, and
//                                 connect resumes it with its variable
//   node keep.mjs kset ID         connect + runCode('z = 2'), nothing else (a cell alone is a use)
//   node keep.mjs kagain ID       after serve and keeper were both killed and serve restarted:
//                                 the same, x + z = 43, then kill
//
// A SIGTERM of serve without a keeper, its sessions durable (--snapshot-every): each goes to
// sleep on a snapshot, and the next serve wakes it (TestServeRestartKeepsSessionsE2B):
//
//   node keep.mjs screate         a sandbox (metadata, envs, variables, one a generator, files by
//                                 the files API and by a cell) and a paused one; prints "ids ID PAUSED"
//   node keep.mjs safter ID PAUSED
//                                 after the restart: getInfo (metadata, time to live; the paused one
//                                 still paused), connect + runCode with every variable back, the
//                                 first cell saying what came back and that g did not; files, envs;
//                                 connect resumes the paused one
//
// Each step prints "ok <step>"; a failure prints the error and exits 1.
import assert from 'node:assert/strict'
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

const text = (ex) => ex.results.find((r) => r.isMainResult)?.text ?? ex.text

// pauseOne is the step that makes a paused sandbox (y = 7) and returns it.
async function pauseOne() {
  let paused
  await step('pause one', async () => {
    paused = await Sandbox.create({ timeoutMs: 600_000 })
    await paused.runCode('y = 7')
    await paused.pause()
    assert.equal((await paused.getInfo()).state, 'paused')
  })
  return paused
}

// infoKept is the step that checks getInfo after a restart: sandbox id's
// metadata and its 10-minute time to live, and paused one pid still paused.
async function infoKept(id, pid, who) {
  await step('getInfo after the restart', async () => {
    const info = await Sandbox.getInfo(id)
    assert.equal(info.metadata.who, who)
    assert.equal(info.state, 'running')
    // The time to live asked at create, not a fresh default of 5 minutes.
    assert.ok(new Date(info.endAt) - Date.now() > 6 * 60_000, `endAt ${info.endAt}`)
    assert.equal((await Sandbox.getInfo(pid)).state, 'paused')
  })
}

switch (process.argv[2]) {
  case 'create': {
    let sbx
    await step('create', async () => {
      sbx = await Sandbox.create({ metadata: { who: 'keep' }, envs: { GREETING: 'hi' }, timeoutMs: 600_000 })
      const ex = await sbx.runCode('x = 41\nimport os\nos.environ["GREETING"]')
      assert.equal(text(ex), "'hi'")
      await sbx.files.write('kept.txt', 'kept')
      await sbx.commands.run('sleep 600', { background: true })
      assert.equal((await sbx.commands.list()).length, 1)
    })
    const paused = await pauseOne()
    console.log(`ids ${sbx.sandboxId} ${paused.sandboxId}`)
    break
  }
  case 'after': {
    const [id, pid] = process.argv.slice(3)
    await infoKept(id, pid, 'keep')
    await step('connect and runCode on the same id', async () => {
      const sbx = await Sandbox.connect(id)
      assert.equal(sbx.sandboxId, id)
      assert.equal(text(await sbx.runCode('x + 1')), '42')
      assert.equal(text(await sbx.runCode('import os\nos.environ["GREETING"]')), "'hi'")
      assert.equal(await sbx.files.read('kept.txt'), 'kept')
      // The old server's commands are not this one's: reported as none.
      assert.equal((await sbx.commands.list()).length, 0)
      const r = await sbx.commands.run('echo $GREETING').catch((e) => { console.log('command failed', e.exitCode, e.stdout, e.stderr, e.error); throw e })
      assert.equal(r.stdout.trim(), 'hi')
    })
    await step('connect resumes the paused one', async () => {
      const p = await Sandbox.connect(pid)
      assert.equal(text(await p.runCode('y')), '7')
      assert.equal((await p.getInfo()).state, 'running')
      await p.kill()
    })
    break
  }
  case 'again': {
    await step('connect after another restart', async () => {
      const sbx = await Sandbox.connect(process.argv[3])
      assert.equal(text(await sbx.runCode('x + 2')), '43')
      await sbx.kill()
    })
    break
  }
  case 'kcreate': {
    let sbx
    await step('create', async () => {
      sbx = await Sandbox.create({ metadata: { who: 'keeper' }, envs: { GREETING: 'hi' }, timeoutMs: 600_000 })
      await sbx.runCode('x = 41\nopen("made.txt", "w").write("by a cell")')
      await sbx.files.write('kept.txt', 'kept')
    })
    const paused = await pauseOne()
    console.log(`ids ${sbx.sandboxId} ${paused.sandboxId}`)
    break
  }
  case 'kafter':
  case 'kagain': {
    const id = process.argv[3]
    const again = process.argv[2] === 'kagain'
    await step('getInfo after the keeper died', async () => {
      const info = await Sandbox.getInfo(id)
      assert.equal(info.metadata.who, 'keeper')
      assert.equal(info.state, 'running')
    })
    await step('connect and runCode on the same id', async () => {
      const sbx = await Sandbox.connect(id)
      assert.equal(sbx.sandboxId, id)
      const ex = await sbx.runCode(again ? 'x + z' : 'x + 1')
      assert.equal(text(ex), again ? '43' : '42')
      // Not silent: the first cell says the sandbox was restored, from
      // what and as of when.
      const said = ex.logs.stderr.join('')
      assert.match(said, /^\[sandloop\] this sandbox was restored from the automatic snapshot \S+ \(the session's processes were lost\)/, `stderr: ${said}`)
      assert.match(said, /as of /)
      const ex2 = await sbx.runCode('1')
      assert.equal(ex2.logs.stderr.join(''), '', 'the restore is told once')
      assert.equal(text(await sbx.runCode('import os\nos.environ["GREETING"]')), "'hi'")
      assert.equal(await sbx.files.read('kept.txt'), 'kept')
      assert.equal(await sbx.files.read('made.txt'), 'by a cell')
      const r = await sbx.commands.run('echo $GREETING')
      assert.equal(r.stdout.trim(), 'hi')
      if (again) {
        await sbx.kill()
      }
    })
    const pid = process.argv[4]
    if (pid) {
      await step('the paused one is still paused; connect resumes it', async () => {
        assert.equal((await Sandbox.getInfo(pid)).state, 'paused')
        const p = await Sandbox.connect(pid)
        const ex = await p.runCode('y')
        assert.equal(text(ex), '7')
        assert.match(ex.logs.stderr.join(''), /this sandbox was restored from/)
        assert.equal((await p.getInfo()).state, 'running')
        await p.kill()
      })
    }
    break
  }
  case 'screate': {
    let sbx
    await step('create', async () => {
      sbx = await Sandbox.create({ metadata: { who: 'shelve' }, envs: { GREETING: 'hi' }, timeoutMs: 600_000 })
      await sbx.runCode('x = 41\nopen("made.txt", "w").write("by a cell")\ng = (i for i in range(3))')
      await sbx.files.write('kept.txt', 'kept')
    })
    const paused = await pauseOne()
    console.log(`ids ${sbx.sandboxId} ${paused.sandboxId}`)
    break
  }
  case 'safter': {
    const [id, pid] = process.argv.slice(3)
    await infoKept(id, pid, 'shelve')
    await step('connect and runCode on the same id: every variable back, and what was not, said', async () => {
      const sbx = await Sandbox.connect(id)
      const ex = await sbx.runCode('x + 1')
      assert.equal(text(ex), '42')
      const said = ex.logs.stderr.join('')
      assert.match(said, /^\[sandloop\] this sandbox was restored from hibernation: files exact \(2 files\); variables restored: .*x/, `stderr: ${said}`)
      assert.match(said, /not restorable: g: /)
      assert.equal((await sbx.runCode('1')).logs.stderr.join(''), '', 'the restore is told once')
      assert.equal(text(await sbx.runCode('import os\nos.environ["GREETING"]')), "'hi'")
      assert.equal(await sbx.files.read('kept.txt'), 'kept')
      assert.equal(await sbx.files.read('made.txt'), 'by a cell')
      assert.equal((await sbx.commands.run('echo $GREETING')).stdout.trim(), 'hi')
      await sbx.kill()
    })
    await step('the paused one is still paused; connect resumes it', async () => {
      const p = await Sandbox.connect(pid)
      assert.equal(text(await p.runCode('y')), '7')
      assert.equal((await p.getInfo()).state, 'running')
      await p.kill()
    })
    break
  }
  case 'kset': {
    await step('runCode alone', async () => {
      const sbx = await Sandbox.connect(process.argv[3])
      await sbx.runCode('z = 2')
    })
    break
  }
  default:
    console.error('usage: node keep.mjs create | after RUNNING PAUSED | again RUNNING | kcreate | kafter ID PAUSED | kset ID | kagain ID | screate | safter ID PAUSED')
    process.exit(2)
}
console.log('done')
process.exit(0)
