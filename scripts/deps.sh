#!/usr/bin/env bash
# Installs what sandloop needs on Debian, idempotently: the sandbox's Python
# and the libraries users reach for most. Runs apt-get only when something
# is missing.
set -euo pipefail
pkgs=(python3 python3-numpy python3-pandas python3-matplotlib python3-flask python3-requests python3-pytest python3-pil
  python3-pip python3-setuptools python3-wheel curl # pip in the sandbox; the egress tests build a wheel and use curl through the proxy
  chromium # chromium: the web UI's browser tests (internal/webui)
  python3-dill # python3-dill: a session's variables move to a forked session (internal/kernel ExportState: lambdas, classes defined in cells)
  s3fs # s3fs: Mastra's default E2B template installs s3fs and fuse (fuse3 provides fuse); present in the sandbox root, its build is the plain environment (cmd/sandloop TestFrameworks)
  python3-sklearn # python3-sklearn: scikit-learn in every sandbox; the templates benchmark preloads it (internal/template BenchmarkTemplateSession)
  python3-nbformat # python3-nbformat: validates the notebook's .ipynb export (internal/server TestNotebookIpynb)
  crun # crun: sandloop inside a container (cmd/sandloop TestInContainer)
  dbus-daemon # dbus-daemon: a private bus for the fake systemd of internal/jail's scope tests
  postgresql # postgresql: the PostgreSQL store's and the cell's tests (internal/store/pgtest starts throwaway clusters)
  gcc libc6-dev) # gcc, libc6-dev: make gen builds the zygote's small static reaper (internal/zygote/reaperexe) and the jail's join program (internal/jail/joinexe)
# QEMU for make test's smoke test of make test-vm, where the VM runner is
# (../shared/vm next to the clone).
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -x "$root/../shared/vm/run.sh" ] || [ -x "$root/../../shared/vm/run.sh" ]; then
  pkgs+=(qemu-system-x86 systemd dbus-user-session) # systemd, dbus-user-session: internal/jail TestRealSystemdScope in the VM
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
command -v go >/dev/null || { echo "Go 1.26 or newer is required (https://go.dev/dl)"; exit 1; }
# The MCP end-to-end tests drive sandloop with the official TypeScript MCP
# client: install it from its committed lock file, once, when Node.js is here
# (without node and npm those tests skip).
tsclient="$(cd "$(dirname "$0")/.." && pwd)/internal/mcpserver/testdata/tsclient"
if [ ! -d "$tsclient/node_modules/@modelcontextprotocol/sdk" ]; then
  if command -v npm >/dev/null && command -v node >/dev/null; then
    echo "installing the TypeScript MCP client for the tests (npm ci)"
    npm ci --prefix "$tsclient" --no-audit --no-fund --loglevel=error
  else
    echo "note: node and npm not found: the TypeScript MCP client tests will skip"
  fi
fi
# The E2B end-to-end tests and benchmark drive sandloop with E2B's official
# npm SDKs (e2b latest and 2.45, @e2b/code-interpreter): same, from their lock file.
e2bsdk="$(cd "$(dirname "$0")/.." && pwd)/internal/e2b/testdata/sdk"
if [ ! -d "$e2bsdk/node_modules/@e2b/code-interpreter" ] || [ ! -d "$e2bsdk/node_modules/e2b-2.45" ]; then
  if command -v npm >/dev/null && command -v node >/dev/null; then
    echo "installing E2B's SDKs for the tests (npm ci)"
    npm ci --prefix "$e2bsdk" --no-audit --no-fund --loglevel=error
  else
    echo "note: node and npm not found: the E2B SDK tests will skip"
  fi
fi
# The agent framework tests (OpenAI Agents, Mastra, ComputeSDK, Deep Agents
# through their E2B integrations): same, from their own lock file.
frameworks="$(cd "$(dirname "$0")/.." && pwd)/internal/e2b/testdata/frameworks"
if [ ! -d "$frameworks/node_modules/@openai/agents-extensions" ] || [ ! -d "$frameworks/node_modules/@mastra/e2b" ] || [ ! -d "$frameworks/node_modules/deepagents" ] || [ ! -d "$frameworks/node_modules/@computesdk/e2b" ]; then
  if command -v npm >/dev/null && command -v node >/dev/null; then
    echo "installing the agent frameworks for the tests (npm ci)"
    timeout 600 npm ci --prefix "$frameworks" --prefer-offline --no-audit --no-fund --loglevel=error
  else
    echo "note: node and npm not found: the agent framework tests will skip"
  fi
fi
