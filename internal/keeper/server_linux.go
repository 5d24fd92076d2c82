package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaybeRun runs the keeper and exits if this process was started as one
// (argv[0] is Arg0); otherwise it returns at once. Call it first in main
// (and in TestMain of tests that start keepers).
func MaybeRun() {
	if len(os.Args) == 0 || os.Args[0] != Arg0 {
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: "+Arg0+" DIR")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1]))
}

// server is the keeper's state.
type server struct {
	dir   string
	log   *log.Logger
	spawn chan spawnJob

	mu       sync.Mutex
	owner    *conn // the server's connection (hello); one at a time
	records  map[string]*record
	children map[int]*child
}

// record is a kept session.
type record struct {
	id    string
	pid   int
	meta  json.RawMessage
	files []*os.File
}

// child is a jail's init the keeper started.
type child struct {
	pid   int
	pidfd int
	owner *conn  // the connection that spawned it or last dropped it; nil once kept
	kept  string // the id of its record, if kept
}

type conn struct{ sock int }

type spawnJob struct {
	owner *conn
	spec  *spawnSpec
	files []*os.File
	done  chan spawnResult
}

type spawnResult struct {
	pid, pidfd int
	err        error
}

var validID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func run(dir string) int {
	logf, err := os.OpenFile(filepath.Join(dir, logName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 1
	}
	lg := log.New(logf, "keeper: ", log.LstdFlags)
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		lg.Print(err)
		return 1
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lg.Print("another keeper holds this directory")
		return 0
	}
	// Signals of a terminal or a server's process group are not for us:
	// only SIGKILL or SIGTERM, sent to this PID, end the sessions.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE, syscall.SIGQUIT)
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, 0, 0, 0, 0)
	// Locked down as far as its work allows (it starts jails, so it keeps
	// its privileges): not dumpable (no ptrace, no /proc/PID/fd of it for
	// other processes of its user), and it holds no directory but the
	// root.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	_ = os.Chdir("/")
	sockPath := filepath.Join(dir, sockName)
	os.Remove(sockPath)
	ls, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		old := unix.Umask(0o177)
		err = unix.Bind(ls, &unix.SockaddrUnix{Name: sockPath})
		unix.Umask(old)
	}
	if err == nil {
		err = unix.Listen(ls, 64)
	}
	if err != nil {
		lg.Printf("listen on %s: %v", sockPath, err)
		return 1
	}
	if err := os.MkdirAll(filepath.Join(dir, metaDir), 0o700); err != nil {
		lg.Print(err)
		return 1
	}
	// Records of a keeper that died are of sessions that died with it:
	// moved to lost/, for whatever restores sessions from snapshots.
	if old, _ := filepath.Glob(filepath.Join(dir, metaDir, "*.json")); len(old) > 0 {
		if err := os.MkdirAll(filepath.Join(dir, lostDir), 0o700); err == nil {
			for _, f := range old {
				os.Rename(f, filepath.Join(dir, lostDir, filepath.Base(f)))
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, pidName), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		lg.Print(err)
		return 1
	}
	s := &server{dir: dir, log: lg, spawn: make(chan spawnJob), records: map[string]*record{}, children: map[int]*child{}}
	go s.spawner()
	lg.Printf("started, pid %d", os.Getpid())
	for {
		fd, _, err := unix.Accept4(ls, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			lg.Printf("accept: %v", err)
			return 1
		}
		go s.serve(&conn{sock: fd})
	}
}

// spawner starts every jail from one thread that never exits: Pdeathsig
// fires when the thread that started a child exits, not the process.
func (s *server) spawner() {
	runtime.LockOSThread()
	for j := range s.spawn {
		pid, pidfd, err := s.start(j.owner, j.spec, j.files)
		j.done <- spawnResult{pid, pidfd, err}
	}
}

func (s *server) start(owner *conn, sp *spawnSpec, files []*os.File) (int, int, error) {
	if sp == nil || len(files) < 3 {
		return 0, -1, fmt.Errorf("want a command and at least 3 descriptors, got %d", len(files))
	}
	pidfd := -1
	c := &exec.Cmd{
		Path: sp.Path, Args: sp.Args, Env: sp.Env,
		Stdin: files[0], Stdout: files[1], Stderr: files[2], ExtraFiles: files[3:],
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:                 sp.Cloneflags,
			UidMappings:                sp.UidMappings,
			GidMappings:                sp.GidMappings,
			GidMappingsEnableSetgroups: sp.GidMappingsEnableSetgroups,
			Credential:                 sp.Credential,
			AmbientCaps:                sp.AmbientCaps,
			Setsid:                     sp.Setsid,
			Pdeathsig:                  syscall.SIGKILL, // dies with the keeper
			PidFD:                      &pidfd,
		},
	}
	if err := c.Start(); err != nil {
		return 0, -1, err
	}
	pid := c.Process.Pid
	s.mu.Lock()
	s.children[pid] = &child{pid: pid, pidfd: pidfd, owner: owner}
	s.mu.Unlock()
	go func() {
		_ = c.Wait()
		s.ended(pid)
	}()
	return pid, pidfd, nil
}

// ended forgets a child that has exited, and its record.
func (s *server) ended(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.children[pid]
	if ch == nil {
		return
	}
	delete(s.children, pid)
	unix.Close(ch.pidfd)
	if r := s.records[ch.kept]; r != nil && r.pid == pid {
		s.dropLocked(r.id)
	}
}

func (s *server) dropLocked(id string) {
	r := s.records[id]
	if r == nil {
		return
	}
	delete(s.records, id)
	closeFiles(r.files)
	os.Remove(filepath.Join(s.dir, metaDir, id+".json"))
}

// serve answers one connection's requests until it closes, then kills
// the jails it spawned and did not hand over.
func (s *server) serve(c *conn) {
	defer func() {
		s.mu.Lock()
		if s.owner == c {
			s.owner = nil
		}
		for _, ch := range s.children {
			if ch.owner == c && ch.kept == "" {
				unix.PidfdSendSignal(ch.pidfd, unix.SIGKILL, nil, 0)
			}
		}
		s.mu.Unlock()
		unix.Close(c.sock)
	}()
	rc := newReceiver(c.sock)
	for {
		var req request
		files, err := rc.receive(&req)
		if err != nil {
			return
		}
		if req.Op == "watch" {
			// Never answered: the server learns of our end by its EOF.
			closeFiles(files)
			var more request
			for {
				f, err := rc.receive(&more)
				closeFiles(f)
				if err != nil {
					return
				}
			}
		}
		if err := s.handle(c, &req, files); err != nil {
			return
		}
	}
}

// handle answers one request; its error means the connection is broken.
func (s *server) handle(c *conn, req *request, files []*os.File) error {
	fail := func(err error) error {
		closeFiles(files)
		return send(c.sock, reply{Error: err.Error()}, nil)
	}
	switch req.Op {
	case "hello":
		closeFiles(files)
		// One server per keeper: two taking the same sessions over would
		// both drive their kernels.
		s.mu.Lock()
		busy := s.owner != nil && s.owner != c
		if !busy {
			s.owner = c
		}
		s.mu.Unlock()
		if busy {
			return send(c.sock, reply{Error: errBusyText}, nil)
		}
		return send(c.sock, reply{Keeper: os.Getpid()}, nil)
	case "spawn":
		done := make(chan spawnResult, 1)
		s.spawn <- spawnJob{c, req.Spawn, files, done}
		r := <-done
		closeFiles(files)
		if r.err != nil {
			// The errno goes too: the server tells an init it cannot
			// execute (EACCES, ENOENT) from other failures.
			var errno syscall.Errno
			errors.As(r.err, &errno)
			return send(c.sock, reply{Error: r.err.Error(), Errno: int(errno)}, nil)
		}
		// (The child may have ended already: its pidfd, closed with it,
		// would be another descriptor's now; send a copy made under the
		// lock, or the error.)
		s.mu.Lock()
		fd := -1
		if ch := s.children[r.pid]; ch != nil {
			fd, _ = unix.FcntlInt(uintptr(ch.pidfd), unix.F_DUPFD_CLOEXEC, 0)
		}
		s.mu.Unlock()
		if fd < 0 {
			return send(c.sock, reply{Error: "the jail's init exited at once"}, nil)
		}
		defer unix.Close(fd)
		return send(c.sock, reply{Pid: r.pid}, []int{fd})
	case "keep":
		if !validID.MatchString(req.ID) || req.Files != len(files) {
			return fail(fmt.Errorf("keep: want a session id and %d descriptors, got %q and %d", req.Files, req.ID, len(files)))
		}
		s.mu.Lock()
		ch := s.children[req.Pid]
		if ch == nil {
			s.mu.Unlock()
			return fail(fmt.Errorf("keep %s: process %d is not a live jail of this keeper", req.ID, req.Pid))
		}
		if old := s.records[req.ID]; old != nil {
			if och := s.children[old.pid]; och != nil && old.pid != req.Pid {
				och.kept, och.owner = "", c // replaced (a restarted kernel): the server kills it
			}
			s.dropLocked(req.ID)
		}
		ch.kept, ch.owner = req.ID, nil
		s.records[req.ID] = &record{id: req.ID, pid: req.Pid, meta: req.Meta, files: files}
		s.mu.Unlock()
		s.writeMeta(req.ID, req.Meta)
		return send(c.sock, reply{}, nil)
	case "drop":
		closeFiles(files)
		s.mu.Lock()
		if r := s.records[req.ID]; r != nil {
			if ch := s.children[r.pid]; ch != nil {
				ch.kept, ch.owner = "", c
			}
			s.dropLocked(req.ID)
		}
		s.mu.Unlock()
		return send(c.sock, reply{}, nil)
	case "list":
		closeFiles(files)
		s.mu.Lock()
		var recs []*record
		for _, r := range s.records {
			recs = append(recs, r)
		}
		// Sent under the lock: a record cannot be dropped (its files
		// closed) while it is being sent.
		defer s.mu.Unlock()
		for _, r := range recs {
			if err := send(c.sock, reply{ID: r.id, Pid: r.pid, Meta: r.meta, Files: len(r.files)}, fdsOf(r.files)); err != nil {
				return err
			}
		}
		return send(c.sock, reply{End: true}, nil)
	}
	return fail(fmt.Errorf("unknown request %q", req.Op))
}

// writeMeta records a kept session's metadata on disk (atomically), for
// what comes after the keeper: restoring sessions from their snapshots.
func (s *server) writeMeta(id string, meta json.RawMessage) {
	p := filepath.Join(s.dir, metaDir, id+".json")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, meta, 0o600); err != nil {
		s.log.Printf("write %s: %v", p, err)
		return
	}
	if err := os.Rename(tmp, p); err != nil {
		s.log.Printf("write %s: %v", p, err)
	}
}
