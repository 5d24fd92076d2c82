package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client is a server's connection to its keeper.
type Client struct {
	dir string
	pid int

	mu   sync.Mutex // one request at a time
	sock int
	rc   *receiver

	watch  int
	dead   chan struct{}
	closed sync.Once
}

// Record is a kept session: its metadata and its descriptors, as the
// server that kept it handed them over.
type Record struct {
	ID    string
	Pid   int
	Meta  json.RawMessage
	Files []*os.File
}

// Connect connects to the keeper of dir, starting one (the program exe,
// detached) if none is running. dir is made if missing (0700).
func Connect(dir, exe string) (*Client, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("keeper: %w", err)
	}
	c, err := dial(dir)
	switch {
	case err == nil:
		return c, nil
	case strings.Contains(err.Error(), errBusyText):
		// A server that has just died may not be gone for the keeper yet.
	default:
		if err := startKeeper(dir, exe); err != nil {
			return nil, err
		}
	}
	last := err
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		c, err := dial(dir)
		if err == nil {
			return c, nil
		}
		last = err
	}
	if strings.Contains(last.Error(), errBusyText) {
		return nil, fmt.Errorf("keeper %s: %w", dir, last)
	}
	logText, _ := os.ReadFile(filepath.Join(dir, logName))
	return nil, fmt.Errorf("keeper: did not start in %s (%v): %s", dir, last, tail(logText, 400))
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// startKeeper starts exe as the keeper of dir, detached from this
// process: its own session, no parent death signal, nothing of ours but
// /dev/null.
func startKeeper(dir, exe string) error {
	devNull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer devNull.Close()
	cmd := &exec.Cmd{
		Path: exe, Args: []string{Arg0, dir}, Dir: "/",
		Env:   []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
		Stdin: devNull, Stdout: devNull, Stderr: devNull,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("keeper: start %s: %w", exe, err)
	}
	// Reaped here while we live; adopted by init once we are gone.
	go cmd.Wait()
	return nil
}

func dialSock(dir string) (int, error) {
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: filepath.Join(dir, sockName)}); err != nil {
		unix.Close(s)
		return -1, err
	}
	return s, nil
}

func dial(dir string) (*Client, error) {
	s, err := dialSock(dir)
	if err != nil {
		return nil, err
	}
	c := &Client{dir: dir, sock: s, rc: newReceiver(s), watch: -1, dead: make(chan struct{})}
	var r reply
	if err := c.call(&request{Op: "hello"}, nil, &r); err != nil {
		unix.Close(s)
		return nil, err
	}
	c.pid = r.Keeper
	if c.watch, err = dialSock(dir); err == nil {
		err = send(c.watch, request{Op: "watch"}, nil)
	}
	if err != nil {
		unix.Close(s)
		if c.watch >= 0 {
			unix.Close(c.watch)
		}
		return nil, err
	}
	go func() {
		var b [1]byte
		for {
			n, _, err := unix.Recvfrom(c.watch, b[:], 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				close(c.dead)
				return
			}
		}
	}()
	return c, nil
}

// Pid is the keeper's PID.
func (c *Client) Pid() int { return c.pid }

// Dead is closed when the keeper has exited (or the client was closed).
func (c *Client) Dead() <-chan struct{} { return c.dead }

// Close closes the connection: the jails spawned on it and not kept are
// killed by the keeper; kept ones stay.
func (c *Client) Close() error {
	c.closed.Do(func() {
		c.mu.Lock()
		unix.Close(c.sock)
		c.sock = -1
		c.mu.Unlock()
		unix.Shutdown(c.watch, unix.SHUT_RDWR)
		<-c.dead
		unix.Close(c.watch)
	})
	return nil
}

// call sends req with files and reads one reply into r.
func (c *Client) call(req *request, files []*os.File, r *reply) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.callLocked(req, files, r, nil)
}

func (c *Client) callLocked(req *request, files []*os.File, r *reply, got *[]*os.File) error {
	if c.sock < 0 {
		return errors.New("keeper: the connection is closed")
	}
	err := send(c.sock, req, fdsOf(files))
	runtime.KeepAlive(files)
	if err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	fs, err := c.rc.receive(r)
	if err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	if got != nil {
		*got = fs
	} else {
		closeFiles(fs)
	}
	if r.Error != "" {
		closeFiles(fs)
		if r.Errno != 0 {
			return &keeperError{r.Error, syscall.Errno(r.Errno)}
		}
		return fmt.Errorf("keeper: %s", r.Error)
	}
	return nil
}

// Spawn starts cmd as the keeper's child (package jail's Config.Spawn):
// it dies with the keeper, not with us. Its stdin, stdout and stderr must
// be files or nil (/dev/null). It returns the PID and a pidfd.
func (c *Client) Spawn(cmd *exec.Cmd) (int, *os.File, error) {
	sys := cmd.SysProcAttr
	if sys == nil {
		sys = &syscall.SysProcAttr{}
	}
	if sys.UseCgroupFD || sys.Unshareflags != 0 || sys.Chroot != "" || sys.Setpgid || sys.Setctty || sys.Foreground || sys.PidFD != nil {
		return 0, nil, errors.New("keeper: cannot start this command") // (none of ours asks for these)
	}
	spec := &spawnSpec{
		Path: cmd.Path, Args: cmd.Args, Env: cmd.Env,
		Cloneflags: sys.Cloneflags, UidMappings: sys.UidMappings, GidMappings: sys.GidMappings,
		GidMappingsEnableSetgroups: sys.GidMappingsEnableSetgroups,
		Credential:                 sys.Credential, AmbientCaps: sys.AmbientCaps, Setsid: sys.Setsid,
	}
	var devNull *os.File
	stdio := func(v any) (*os.File, error) {
		switch f := v.(type) {
		case nil:
		case *os.File:
			return f, nil
		default:
			if v != nil {
				return nil, fmt.Errorf("keeper: a command's stdio must be a file, not %T", v)
			}
		}
		if devNull == nil {
			var err error
			if devNull, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
				return nil, err
			}
		}
		return devNull, nil
	}
	var files []*os.File
	for _, v := range []any{readerOf(cmd.Stdin), writerOf(cmd.Stdout), writerOf(cmd.Stderr)} {
		f, err := stdio(v)
		if err != nil {
			if devNull != nil {
				devNull.Close()
			}
			return 0, nil, err
		}
		files = append(files, f)
	}
	if devNull != nil {
		defer devNull.Close()
	}
	files = append(files, cmd.ExtraFiles...)
	var r reply
	var got []*os.File
	c.mu.Lock()
	err := c.callLocked(&request{Op: "spawn", Spawn: spec, Files: len(files)}, files, &r, &got)
	c.mu.Unlock()
	if err != nil {
		return 0, nil, err
	}
	if len(got) != 1 {
		closeFiles(got)
		return 0, nil, errors.New("keeper: no pidfd came with the reply")
	}
	return r.Pid, got[0], nil
}

// readerOf and writerOf turn a nil interface holding a nil value into nil.
func readerOf(r io.Reader) any {
	if r == nil {
		return nil
	}
	return r
}

func writerOf(w io.Writer) any {
	if w == nil {
		return nil
	}
	return w
}

// Keep hands the keeper a session's metadata and copies of its
// descriptors (files stay ours), replacing its previous record. pid is
// the session's jail, spawned by this keeper.
func (c *Client) Keep(id string, pid int, meta []byte, files []*os.File) error {
	var r reply
	return c.call(&request{Op: "keep", ID: id, Pid: pid, Meta: meta, Files: len(files)}, files, &r)
}

// Drop forgets session id's record (the session is being closed; its
// jail, if still alive, dies when this connection closes).
func (c *Client) Drop(id string) error {
	var r reply
	return c.call(&request{Op: "drop", ID: id}, nil, &r)
}

// List returns every kept session, with copies of its descriptors (the
// caller's to close).
func (c *Client) List() ([]Record, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Record
	var r reply
	var got []*os.File
	if err := c.callLocked(&request{Op: "list"}, nil, &r, &got); err != nil {
		return nil, err
	}
	for !r.End {
		if len(got) != r.Files {
			closeFiles(got)
			for _, rec := range out {
				closeFiles(rec.Files)
			}
			return nil, fmt.Errorf("keeper: record %s came with %d descriptors of %d", r.ID, len(got), r.Files)
		}
		out = append(out, Record{ID: r.ID, Pid: r.Pid, Meta: r.Meta, Files: got})
		r = reply{}
		var err error
		if got, err = c.rc.receive(&r); err != nil {
			for _, rec := range out {
				closeFiles(rec.Files)
			}
			return nil, fmt.Errorf("keeper: %w", err)
		}
	}
	return out, nil
}

// keeperError is a failure the keeper reported with its errno: errors.Is
// matches it as the errno (fs.ErrPermission for EACCES...).
type keeperError struct {
	msg   string
	errno syscall.Errno
}

func (e *keeperError) Error() string { return "keeper: " + e.msg }
func (e *keeperError) Unwrap() error { return e.errno }
