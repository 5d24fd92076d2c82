package jail

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
	"golang.org/x/sys/unix"
)

// screen collects what a terminal displays.
type screen struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *screen) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// waitShown waits until the terminal has displayed a match of re after
// from bytes of output, and returns the end of that match.
func (s *screen) waitShown(t *testing.T, from int, re string) int {
	t.Helper()
	rx := regexp.MustCompile(re)
	end := 0
	testutil.WaitFor(t, 30*time.Second, func() error {
		out := s.String()
		if loc := rx.FindStringIndex(out[from:]); loc != nil {
			end = from + loc[1]
			return nil
		}
		return fmt.Errorf("no %q in what the terminal shows after byte %d:\n%q", re, from, out[from:])
	})
	return end
}

// terminalFDs counts this process's descriptors of pseudo-terminal masters.
func terminalFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target == "/dev/ptmx" || strings.HasPrefix(target, "/dev/pts/") {
			n++
		}
	}
	return n
}

// startTerminal starts an interactive python3 -q on a terminal of ws.
func startTerminal(t *testing.T, ws WindowSize, args ...string) (*Process, *io.PipeWriter, *screen) {
	t.Helper()
	in, typed := io.Pipe()
	t.Cleanup(func() { typed.Close() })
	out := &screen{}
	p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: append([]string{"python3"}, args...),
		Workspace: testWorkspace(t), Stdin: in, Stdout: out, Terminal: &ws, Limits: Limits{Timeout: 2 * time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	return p, typed, out
}

// An interactive Python on the jail's terminal: it answers what is typed,
// sees a terminal on 0-2 as its controlling terminal (the jail's own, new
// pair), hears a resize, and ends when killed, leaving no terminal open.
func TestTerminalInteractivePython(t *testing.T) {
	before := terminalFDs(t)
	p, typed, out := startTerminal(t, WindowSize{Cols: 80, Rows: 24}, "-q")
	if got := terminalFDs(t); got != before+1 {
		t.Errorf("%d terminal descriptors held while it runs, want %d (the master only)", got, before+1)
	}
	at := out.waitShown(t, 0, `>>> $`)
	io.WriteString(typed, "1+1\n")
	at = out.waitShown(t, at, `1\+1\r\n2\r\n>>> $`)

	// Which terminal it is: the number of the pair the host made.
	rc, _ := p.tty.SyscallConn()
	var ptn uint32
	rc.Control(func(fd uintptr) { ptn, _ = unix.IoctlGetUint32(int(fd), unix.TIOCGPTN) })
	io.WriteString(typed, "import os; st = os.fstat(0); ctty = os.open('/dev/tty', os.O_RDWR); "+
		"print('tty', [os.isatty(i) for i in range(3)], os.getsid(0) == os.getpid(), os.tcgetpgrp(0) == os.getpgrp(), "+
		"os.minor(st.st_rdev), os.tcgetpgrp(ctty) == os.getpgrp())\n")
	want := fmt.Sprintf(`\r\ntty \[True, True, True\] True True %d True\r\n`, ptn)
	at = out.waitShown(t, at, want)

	io.WriteString(typed, "import signal; signal.signal(signal.SIGWINCH, lambda *a: print('winch', os.get_terminal_size()))\n")
	at = out.waitShown(t, at, `SIG_DFL: 0>\r\n>>> $`)
	if err := p.Resize(WindowSize{Cols: 132, Rows: 43}); err != nil {
		t.Fatal(err)
	}
	// Python runs a signal's handler at its next bytecode: one that came
	// before the REPL blocked in its read waits for input (seen once under
	// stress-ng). An empty line lets it run; the handler still has to have
	// been called, with the new size.
	io.WriteString(typed, "\n")
	at = out.waitShown(t, at, `winch os.terminal_size\(columns=132, lines=43\)`)
	io.WriteString(typed, "import subprocess; subprocess.run(['stty', 'size'])\n")
	at = out.waitShown(t, at, `\r\n43 132\r\n`)
	io.WriteString(typed, "print(6*7)\n")
	out.waitShown(t, at, `\r\n42\r\n`)

	if err := p.Resize(WindowSize{Cols: 0, Rows: 5}); err == nil {
		t.Error("Resize to 0 columns: no error")
	}
	p.Kill()
	r, err := p.Wait()
	if err != nil || r.Signal != "SIGKILL" {
		t.Fatalf("after Kill: %+v, %v", r, err)
	}
	if got := terminalFDs(t); got != before {
		t.Errorf("%d terminal descriptors after the end, want %d", got, before)
	}
	if err := p.Resize(WindowSize{Cols: 80, Rows: 24}); err == nil {
		t.Error("Resize after the end: no error")
	}
}

// What a program writes just before it exits is all read, and the end is
// reported; a terminal jail that ends by itself leaves nothing open.
func TestTerminalOutputBeforeExit(t *testing.T) {
	before := terminalFDs(t)
	p, _, out := startTerminal(t, WindowSize{Cols: 80, Rows: 24}, "-c", "import sys; sys.stdout.write('x' * 200000 + 'END'); sys.exit(3)")
	r, err := p.Wait()
	if err != nil || r.ExitCode != 3 {
		t.Fatalf("Wait: %+v, %v", r, err)
	}
	if got := out.String(); len(got) != 200003 || !strings.HasSuffix(got, "END") {
		t.Errorf("read %d bytes ending %q, want 200003 ending END", len(got), got[max(0, len(got)-10):])
	}
	if got := terminalFDs(t); got != before {
		t.Errorf("%d terminal descriptors after the end, want %d", got, before)
	}
}

// On its own terminal, the program still cannot push input into it
// (TIOCSTI, TIOCLINUX) or change its line discipline (TIOCSETD), not even
// with high bits set in the request, which the kernel ignores.
func TestTerminalIoctlsRefused(t *testing.T) {
	code := `import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
arg = ctypes.c_int(13)  # N_HDLC for TIOCSETD; a byte for TIOCSTI
out = []
for name, req in (('TIOCSTI', 0x5412), ('TIOCLINUX', 0x541C), ('TIOCSETD', 0x5423)):
    for high in (0, 1 << 32, 0xffffffff << 32):
        ctypes.set_errno(0)
        r = libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_ulong(req | high), ctypes.byref(arg))
        out.append('%s+%x=%d:%d' % (name, high, r, ctypes.get_errno()))
print('RESULT', ' '.join(out))
`
	p, _, out := startTerminal(t, WindowSize{Cols: 200, Rows: 24}, "-c", code)
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	line := out.String()
	if i := strings.Index(line, "RESULT "); i >= 0 {
		line = strings.TrimSpace(line[i+7:])
	}
	fields := strings.Fields(line)
	if len(fields) != 9 {
		t.Fatalf("want 9 results, got %d: %q", len(fields), fields)
	}
	for _, f := range fields {
		if !strings.HasSuffix(f, "=-1:1") {
			t.Errorf("%s: want -1, errno 1 (EPERM)", f)
		}
	}
}

// A terminal's size is checked; a jail without one has no /dev/tty and
// cannot be resized.
func TestTerminalArguments(t *testing.T) {
	_, err := Start(context.Background(), &Config{Path: DefaultPython, Workspace: testWorkspace(t), Terminal: &WindowSize{Cols: 80, Rows: 0}})
	if ae, ok := err.(*ArgumentError); !ok || ae.Name != "terminal size" {
		t.Errorf("0 rows: %v, want an ArgumentError about the terminal size", err)
	}
	r := runPy(t, `import os; print(os.path.exists('/dev/tty'), os.isatty(0), os.isatty(1))`, nil)
	if got := strings.TrimSpace(r.stdout); got != "False False False" {
		t.Errorf("without a terminal: %q, want False False False", got)
	}
	p, err := Start(context.Background(), &Config{Path: "/bin/true", Workspace: testWorkspace(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(WindowSize{Cols: 80, Rows: 24}); err == nil {
		t.Error("Resize of a jail without a terminal: no error")
	}
	p.Wait()
}
