#!/bin/sh
# Copies xterm.js from npm (the versions of package-lock.json) into
# ../assets/vendor, where the web UI's page loads it from the server itself.
# Run by `go generate ./internal/webui` after a version change; the copies
# are committed, so building sandloop needs neither npm nor a network.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
out=../assets/vendor
mkdir -p "$out"
copy() { # copy PACKAGE FILE NAME: the file without its source map comment, headed by where it came from
	v=$(node -p "require('./node_modules/$1/package.json').version")
	{
		printf '/* %s %s (MIT, see LICENSE-xterm.txt), from npm */\n' "$1" "$v"
		grep -v '^//# sourceMappingURL=' "node_modules/$1/$2"
	} > "$out/$3"
}
copy @xterm/xterm lib/xterm.mjs xterm.mjs
copy @xterm/xterm css/xterm.css xterm.css
copy @xterm/addon-fit lib/addon-fit.mjs addon-fit.mjs
cp node_modules/@xterm/xterm/LICENSE "$out/LICENSE-xterm.txt"
