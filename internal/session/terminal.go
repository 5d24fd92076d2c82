package session

import (
	"context"
	"io"

	"github.com/sandloop/sandloop/internal/jail"
)

// TerminalShell is what a terminal runs: an interactive login shell, as
// E2B's PTYs do.
var TerminalShell = []string{"/bin/bash", "-i", "-l"}

// StartTerminal starts TerminalShell on a new pseudo-terminal of size ws
// inside the session's jail (StartCommand): it shares the kernel's files,
// /tmp, loopback, processes and network. What is read from stdin is typed
// into the terminal; stdout gets what it displays. The caller owns the
// process: it must Kill it, at the latest when the session is Done, and
// Wait for it. ctx ending kills it too.
func (m *Managed) StartTerminal(ctx context.Context, ws jail.WindowSize, stdin io.Reader, stdout io.Writer) (*jail.Process, error) {
	if m.isClosed() {
		return nil, ErrClosed
	}
	return m.StartCommand(ctx, Command{
		Path:     TerminalShell[0],
		Args:     append([]string{"bash"}, TerminalShell[1:]...),
		Env:      []string{"TERM=xterm-256color", "COLORTERM=truecolor", "LC_ALL=C.UTF-8"},
		Stdin:    stdin,
		Stdout:   stdout,
		Terminal: &ws,
	})
}
