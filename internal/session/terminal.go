package session

import (
	"context"
	"io"
	"sort"
	"strings"

	"github.com/sandloop/sandloop/internal/jail"
)

// TerminalShell is what a terminal runs: an interactive login shell, as
// E2B's PTYs do.
var TerminalShell = []string{"/bin/bash", "-i", "-l"}

// StartTerminal starts TerminalShell on a new pseudo-terminal of size ws,
// in a jail of its own on the session's workspace, with the session's
// limits, network and variables (as E2B's commands run: it shares the
// kernel's files, not its processes, /tmp or loopback; a session that
// reaches out through an allowlist has no network in its terminal). What is
// read from stdin is typed into the terminal; stdout gets what it
// displays. The caller owns the process: it must Kill it, at the latest
// when the session is Done, and Wait for it. ctx ending kills it too.
func (m *Managed) StartTerminal(ctx context.Context, ws jail.WindowSize, stdin io.Reader, stdout io.Writer) (*jail.Process, error) {
	if m.isClosed() {
		return nil, ErrClosed
	}
	limits := m.Limits
	limits.Timeout = 0
	return jail.Start(ctx, &jail.Config{
		Path:      TerminalShell[0],
		Args:      append([]string{"bash"}, TerminalShell[1:]...),
		Env:       m.terminalEnv(),
		Workspace: m.Workspace(),
		Limits:    limits,
		Network:   m.Network,
		Stdin:     stdin,
		Stdout:    stdout,
		Terminal:  &ws,
	})
}

// terminalEnv is a kernel's environment without its plotting backend, for
// a terminal that understands xterm's sequences, then the session's
// variables.
func (m *Managed) terminalEnv() []string {
	var env []string
	for _, kv := range kernelEnv {
		if !strings.HasPrefix(kv, "MPLBACKEND=") {
			env = append(env, kv)
		}
	}
	env = append(env, "TERM=xterm-256color", "COLORTERM=truecolor", "LC_ALL=C.UTF-8")
	keys := make([]string, 0, len(m.opts.Env))
	for k := range m.opts.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+m.opts.Env[k])
	}
	return env
}
