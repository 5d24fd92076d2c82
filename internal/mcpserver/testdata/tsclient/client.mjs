// Drives sandloop's MCP server with the official TypeScript MCP SDK client
// and prints what it saw as one JSON object on stdout; the Go test
// (internal/mcpserver/e2e_test.go) makes the assertions.
//
//   node client.mjs stdio /path/to/sandloop mcp [flags...]
//   node client.mjs http http://127.0.0.1:PORT/mcp
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, ...rest] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  // The whole environment: the Go test tells its own binary to act as sandloop.
  transport = new StdioClientTransport({ command: target, args: rest, env: process.env, stderr: "inherit" });
} else if (mode === "http") {
  transport = new StreamableHTTPClientTransport(new URL(target));
} else {
  console.error("usage: node client.mjs stdio COMMAND [ARGS...] | http URL");
  process.exit(2);
}

const client = new Client({ name: "sandloop-e2e", version: "1.0.0" });
await client.connect(transport);

const text = (res) => res.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");
// summary keeps what the Go test checks of a tool result.
const summary = (res) => ({
  isError: res.isError === true,
  text: text(res),
  structured: res.structuredContent ?? null,
  images: res.content
    .filter((c) => c.type === "image")
    .map((c) => ({ mimeType: c.mimeType, magic: Buffer.from(c.data, "base64").subarray(0, 8).toString("hex") })),
});
const call = async (name, args) => summary(await client.callTool({ name, arguments: args }));
// protocolError calls a tool expecting the request itself to be refused.
const protocolError = async (name, args) => {
  try {
    const res = await client.callTool({ name, arguments: args });
    return { refused: false, result: summary(res) };
  } catch (err) {
    return { refused: true, code: err.code ?? null, message: String(err.message ?? err) };
  }
};

const out = { server: client.getServerVersion() };
const listed = await client.listTools();
out.tools = listed.tools.map((t) => ({
  name: t.name,
  annotations: t.annotations ?? null,
  required: t.inputSchema.required ?? [],
  hasOutputSchema: Boolean(t.outputSchema),
}));

out.state1 = await call("execute_python", { code: "x = 41\nprint('hello from the sandbox')" });
out.state2 = await call("execute_python", { code: "x + 1" });
out.plot = await call("execute_python", {
  code: "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('squares')\nplt.show()",
  timeout_s: 60,
});
out.pyError = await call("execute_python", { code: "def f():\n    return 1 / 0\nf()" });
out.write = await call("write_file", { path: "notes/hello.txt", content: "written by the TypeScript client\n" });
out.pyRead = await call("execute_python", { code: "open('notes/hello.txt').read().upper()" });
out.pyWrite = await call("execute_python", { code: "open('made_by_python.csv', 'w').write('a,b\\n1,2\\n')" });
out.read = await call("read_file", { path: "made_by_python.csv" });
out.list = await call("list_files", {});
out.shell = await call("run_shell", { command: "wc -l < made_by_python.csv && ls notes" });
out.unknownTool = await protocolError("no_such_tool", {});
out.wrongType = await protocolError("execute_python", { code: 42 });
out.afterBadInput = await call("execute_python", { code: "x * 2" });

if (mode === "http") {
  await transport.terminateSession();
}
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
