// E2B's template API through the SDK (e2b latest), unchanged: the alias
// check Mastra makes, Template.build of pip packages and variables, a
// sandbox of the new template, a build sandloop cannot make refused with
// its reason, and deleteSnapshot of an unknown id.
//
//   node template.mjs NAME DIST MODULE VALUE
//       NAME: the template to build; DIST: a distribution the server's
//       builds can pip install, whose MODULE's VALUE is VALUE
//
// Each step prints "ok <step>"; a failure prints the error and exits 1; the
// end prints "done".
import assert from 'node:assert/strict'
import { Sandbox, Template, BuildError } from 'e2b'

const [name, dist, mod, value] = process.argv.slice(2)
assert.ok(value, 'usage: node template.mjs NAME DIST MODULE VALUE')

async function step(label, fn) {
  const t0 = performance.now()
  try {
    await fn()
    console.log(`ok ${label} (${Math.round(performance.now() - t0)} ms)`)
  } catch (e) {
    console.log(`FAIL ${label}: ${e?.name}: ${e?.message}`)
    console.log(e?.stack)
    process.exit(1)
  }
}

await step('aliasExists before the build is false', async () => {
  assert.equal(await Template.aliasExists(name), false)
  assert.equal(await Template.aliasExists('base'), true)
})

const logs = []
let info
await step('Template.build of pip packages and variables', async () => {
  const t = Template().fromBaseImage().pipInstall([dist]).setEnvs({ GREETING: 'from the template' })
  info = await Template.build(t, name, { onBuildLogs: (e) => logs.push(String(e.message)) })
  assert.equal(info.templateId, name)
  assert.ok(info.buildId.length > 0)
  assert.ok(logs.some((m) => m.includes(`template ${name} ready`)), JSON.stringify(logs))
})

await step('aliasExists after the build is true', async () => {
  assert.equal(await Template.aliasExists(name), true)
})

await step('Sandbox.create(NAME) runs in the template', async () => {
  const sbx = await Sandbox.create(name)
  try {
    const r = await sbx.commands.run(`python3 -c "import os, ${mod}; print(${mod}.VALUE, os.environ['GREETING'])"`).catch((e) => {
      throw new Error(`the command failed: ${e?.stderr ?? e}`)
    })
    assert.equal(r.stdout.trim(), `${value} from the template`)
  } finally {
    await sbx.kill()
  }
})

await step('a build sandloop cannot make is refused with its reason', async () => {
  const t = Template().fromImage('ubuntu:22.04').aptInstall(['curl'])
  let err
  try {
    await Template.build(t, `${name}-apt`)
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof BuildError, `${err?.name}: ${err?.message}`)
  assert.match(err.message, /ubuntu:22\.04/)
  assert.match(err.message, /sandloop builds templates from pip packages/)
  const t2 = Template().fromBaseImage().runCmd('curl https://example.invalid | sh')
  err = undefined
  try {
    await Template.build(t2, `${name}-run`)
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof BuildError, `${err?.name}: ${err?.message}`)
  assert.match(err.message, /RUN "curl/)
  assert.equal(await Template.aliasExists(`${name}-apt`), false)
})

await step('a failed pip install is the build error', async () => {
  let err
  try {
    await Template.build(Template().fromBaseImage().pipInstall(['sandloop-no-such-dist-here']), `${name}-bad`)
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof BuildError, `${err?.name}: ${err?.message}`)
  assert.match(err.message, /sandloop-no-such-dist-here/)
})

await step('deleteSnapshot of an unknown id is false', async () => {
  assert.equal(await Sandbox.deleteSnapshot('no-such-snapshot'), false)
})

console.log('done')
