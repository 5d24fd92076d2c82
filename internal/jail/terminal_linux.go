package jail

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// openTerminal makes a new pseudo-terminal pair of size ws for one jail:
// the master, which the host keeps (non-blocking, so the runtime's poller
// serves it and Close ends a blocked Read), and the slave the jail gets.
// The slave is opened through the master (TIOCGPTPEER), never by a path
// under /dev/pts that another process could have swapped.
func openTerminal(ws WindowSize) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	master = os.NewFile(uintptr(fd), "terminal")
	fail := func(what string, err error) (*os.File, *os.File, error) {
		master.Close()
		if slave != nil {
			slave.Close()
		}
		return nil, nil, fmt.Errorf("pseudo-terminal: %s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("open its other end", errno)
	}
	slave = os.NewFile(sfd, "terminal-slave")
	// Erase removes a whole UTF-8 character in a line being typed.
	t, err := unix.IoctlGetTermios(int(sfd), unix.TCGETS)
	if err != nil {
		return fail("get modes", err)
	}
	t.Iflag |= unix.IUTF8
	if err := unix.IoctlSetTermios(int(sfd), unix.TCSETS, t); err != nil {
		return fail("set modes", err)
	}
	if err := setWindowSize(fd, ws); err != nil {
		return fail("set size", err)
	}
	return master, slave, nil
}

func setWindowSize(fd int, ws WindowSize) error {
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: uint16(ws.Cols), Row: uint16(ws.Rows)})
}

// serveTerminal copies in (if any) into the terminal and what it displays
// to out (discarded if nil) until the jail ends.
func (p *Process) serveTerminal(in io.Reader, out io.Writer) {
	if out == nil {
		out = io.Discard // the program would block on a full terminal
	}
	go func() {
		defer close(p.ttyDone)
		// Ends with EIO once no process of the jail holds the terminal,
		// after what they wrote has been read, or when wait closes it.
		_, _ = io.Copy(out, p.tty)
	}()
	if in != nil {
		// Returns once in's Read does and the next write fails (after
		// the jail's end at the latest when the caller closes in).
		go func() { _, _ = io.Copy(p.tty, in) }()
	}
}

// closeTerminal waits for the output of an ended jail to be read (a little:
// a descriptor passed out of the jail could hold the terminal open), then
// closes the host's end.
func (p *Process) closeTerminal() {
	if p.tty == nil {
		return
	}
	select {
	case <-p.ttyDone:
	case <-time.After(2 * time.Second):
	}
	p.tty.Close()
	<-p.ttyDone
}

// Resize sets the size of the program's terminal (Config.Terminal); the
// program gets SIGWINCH.
func (p *Process) Resize(ws WindowSize) error {
	if p.tty == nil {
		return errors.New("jail: the program has no terminal")
	}
	if err := ws.validate(); err != nil {
		return err
	}
	rc, err := p.tty.SyscallConn()
	if err != nil {
		return err
	}
	if cerr := rc.Control(func(fd uintptr) { err = setWindowSize(int(fd), ws) }); cerr != nil {
		return fmt.Errorf("resize: the jail has ended: %w", cerr)
	}
	return err
}
