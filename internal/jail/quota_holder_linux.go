package jail

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Workspaces without root on kernels that cannot clone a detached mount
// (before 6.15): a holder process.
//
// A jail may bind (MS_BIND) only a mount of its own mount namespace
// (fs/namespace.c, __do_loopback: check_mnt), and before 6.15 open_tree
// refuses to clone a mount attached nowhere, so the detached tmpfs of
// quota_userns_linux.go cannot reach a jail there. What does work on
// those kernels: a mount namespace is copied, mounts and all, into the
// new mount namespace of a child. So one long-lived holder per server
// (this package's init program under holderArg0), in a user and mount
// namespace of its own (root there is the server's uid, as for the
// detached tmpfs), mounts a small tmpfs, MS_SHARED, on a private
// directory the server made (baseDir, 0700), and one sized tmpfs per
// workspace under it; it sends the server an O_PATH descriptor of each,
// so the workspace's Path is /proc/self/fd/N/<dir> as with the detached
// tmpfs (the files API, archives, --with and --out are unchanged). The
// jails of such a workspace are started by the holder, so that their
// mount namespace is a copy of its own, where the workspace is an
// ordinary mount that the init binds by path (oldRoot + the directory).
// The holder clones them with CLONE_PARENT: each is the server's child,
// waited for, signalled and placed in its cgroup by the server exactly as
// a jail it starts itself; its Pdeathsig is relative to the server too.
// A workspace mounted later propagates (base is shared, each jail's copy
// a slave of it) into jails already running, which is how a zygote
// template started by the holder reaches the workspaces of the sessions
// it forks.
//
// The holder is started with Pdeathsig SIGKILL: if the server is killed
// (-9 included), it dies, its mount namespace goes and with it every
// workspace no jail still holds; only the empty base directory is left,
// which the next sandloop sweeps (it is named as OwnedTempDir names
// workspaces). Removing a workspace detaches its mount in the holder
// (MNT_DETACH): jails that hold it keep its files until they end. The
// holder is not restarted: should it die alone (only its user or the OOM
// killer can kill it), its workspaces are gone and new ones fail with
// "the holder has exited" until sandloop restarts.

// holderArg0 is argv[0] of the holder. It gets the base directory as its
// argument and its socket as descriptor 3.
const holderArg0 = "sandloop-quota-holder"

// holderRequest is one request to the holder: one message on its socket
// (SOCK_SEQPACKET), with descriptors for "spawn".
type holderRequest struct {
	Op string `json:"op"` // "mount", "unmount" or "spawn"
	// mount: the tmpfs's caps.
	Size   int64 `json:"size,omitempty"`
	Inodes int   `json:"inodes,omitempty"`
	// unmount: the workspace's directory under the base.
	Name  string        `json:"name,omitempty"`
	Spawn *spawnRequest `json:"spawn,omitempty"`
}

// spawnRequest is an exec.Cmd for the holder to start; its descriptors
// (stdin, stdout, stderr, then the extra files) come with the message.
type spawnRequest struct {
	Path                       string                 `json:"path"`
	Args                       []string               `json:"args"`
	Env                        []string               `json:"env"`
	Cloneflags                 uintptr                `json:"clone_flags"`
	UidMappings                []syscall.SysProcIDMap `json:"uid_map"`
	GidMappings                []syscall.SysProcIDMap `json:"gid_map"`
	GidMappingsEnableSetgroups bool                   `json:"setgroups"`
	Credential                 *syscall.Credential    `json:"cred,omitempty"`
	AmbientCaps                []uintptr              `json:"caps,omitempty"`
	Pdeathsig                  syscall.Signal         `json:"pdeathsig"`
	Setsid                     bool                   `json:"setsid"`
	Files                      int                    `json:"files"`
}

type holderReply struct {
	Name  string `json:"name,omitempty"`
	Pid   int    `json:"pid,omitempty"`
	Error string `json:"error,omitempty"`
}

// holderMaxFDs bounds the descriptors of one message (the kernel's
// SCM_MAX_FD is 253).
const holderMaxFDs = 253

// runHolder is the holder's body, in its user and mount namespaces.
func runHolder() int {
	const sock = 3
	reply := func(r holderReply, fd int) error {
		b, _ := json.Marshal(r)
		var rights []byte
		if fd >= 0 {
			rights = unix.UnixRights(fd)
		}
		return unix.Sendmsg(sock, b, rights, nil, 0)
	}
	if len(os.Args) != 2 {
		_ = reply(holderReply{Error: "want the base directory"}, -1)
		return 2
	}
	base := os.Args[1]
	// (Not for the jails it starts.)
	unix.CloseOnExec(sock)
	// Keep the holder's mounts out of the server's namespace (which they
	// could not reach anyway: this one is less privileged), then share
	// base with the copies the jails get.
	err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, "")
	if err == nil {
		err = unix.Mount("tmpfs", base, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,nr_inodes=65536,mode=0700")
	}
	if err == nil {
		err = unix.Mount("", base, "", unix.MS_SHARED, "")
	}
	if err != nil {
		_ = reply(holderReply{Error: fmt.Sprintf("mount the base tmpfs: %v", err)}, -1)
		return 1
	}
	if reply(holderReply{}, -1) != nil {
		return 1
	}
	buf, oob := make([]byte, 1<<20), make([]byte, unix.CmsgSpace(4*holderMaxFDs))
	for {
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0 // the server is gone
		}
		// As files, closed here (never by a finalizer later, when their
		// numbers may be another descriptor's).
		var files []*os.File
		for _, fd := range receivedFDs(oob[:oobn]) {
			files = append(files, os.NewFile(uintptr(fd), "fd"+strconv.Itoa(len(files))))
		}
		var req holderRequest
		r, fd := holderReply{}, -1
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			r.Error = "bad request: " + err.Error()
		} else {
			r, fd = serveHolder(base, &req, files)
		}
		for _, f := range files {
			f.Close()
		}
		err = reply(r, fd)
		if fd >= 0 {
			unix.Close(fd)
		}
		if err != nil {
			return 1
		}
	}
}

func serveHolder(base string, req *holderRequest, files []*os.File) (holderReply, int) {
	fail := func(err error) (holderReply, int) { return holderReply{Error: err.Error()}, -1 }
	switch req.Op {
	case "mount":
		var b [8]byte
		_, _ = rand.Read(b[:])
		name := hex.EncodeToString(b[:])
		dir := filepath.Join(base, name)
		if err := unix.Mkdir(dir, 0o700); err != nil {
			return fail(err)
		}
		data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", req.Size, req.Inodes)
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
			unix.Rmdir(dir)
			return fail(fmt.Errorf("mount tmpfs (%s): %w", data, err))
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			unix.Rmdir(dir)
			return fail(err)
		}
		return holderReply{Name: name}, fd
	case "unmount":
		if _, err := hex.DecodeString(req.Name); err != nil || req.Name == "" {
			return fail(errors.New("not a workspace's name"))
		}
		dir := filepath.Join(base, req.Name)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fail(err)
		}
		unix.Rmdir(dir)
		return holderReply{}, -1
	case "spawn":
		pid, err := holderSpawn(req.Spawn, files)
		if err != nil {
			return fail(err)
		}
		return holderReply{Pid: pid}, -1
	}
	return fail(fmt.Errorf("unknown request %q", req.Op))
}

// holderSpawn starts s with the descriptors files as the server's child
// (CLONE_PARENT) in a copy of the holder's mount namespace.
func holderSpawn(s *spawnRequest, files []*os.File) (int, error) {
	if s == nil || s.Files < 3 || s.Files != len(files) {
		return 0, fmt.Errorf("want a command and at least 3 descriptors, got %d", len(files))
	}
	cmd := func(path string) *exec.Cmd {
		return &exec.Cmd{
			Path: path, Args: s.Args, Env: s.Env,
			Stdin: files[0], Stdout: files[1], Stderr: files[2], ExtraFiles: files[3:],
			SysProcAttr: &syscall.SysProcAttr{
				Cloneflags:                 s.Cloneflags | unix.CLONE_PARENT,
				UidMappings:                s.UidMappings,
				GidMappings:                s.GidMappings,
				GidMappingsEnableSetgroups: s.GidMappingsEnableSetgroups,
				Credential:                 s.Credential,
				AmbientCaps:                s.AmbientCaps,
				Pdeathsig:                  s.Pdeathsig,
				Setsid:                     s.Setsid,
			},
		}
	}
	c := cmd(s.Path)
	err := c.Start()
	if err != nil && s.Path != selfExe && (errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist)) {
		// As startInit: the holder is the init program too.
		c = cmd(selfExe)
		err = c.Start()
	}
	if err != nil {
		return 0, err
	}
	pid := c.Process.Pid
	// The server waits for it: the holder is not its parent.
	_ = c.Process.Release()
	return pid, nil
}

func receivedFDs(oob []byte) []int {
	var fds []int
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for i := range msgs {
		got, _ := unix.ParseUnixRights(&msgs[i])
		fds = append(fds, got...)
	}
	return fds
}

// quotaHolder is the server's side of its holder.
type quotaHolder struct {
	mu   sync.Mutex // one request at a time
	sock int
	base string
	dead chan struct{} // closed when the holder has exited
}

// theHolder starts this process's holder the first time it is needed.
var theHolder = sync.OnceValues(startHolder)

func startHolder() (*quotaHolder, error) {
	// Our own processes must already be in their cgroup leaf (cgroup v2:
	// no internal processes) when the holder, and the jails it starts,
	// inherit our group.
	detectCgroups()
	base, err := OwnedTempDir("holder")
	if err == nil {
		// Resolved: a zygote finds workspaces by their path under the
		// (resolved) temporary directory.
		var resolved string
		if resolved, err = filepath.EvalSymlinks(base); err == nil {
			base = resolved
		} else {
			os.Remove(base)
		}
	}
	if err != nil {
		return nil, err
	}
	type started struct {
		h   *quotaHolder
		err error
	}
	ch := make(chan started, 1)
	// Pdeathsig fires when the thread that started the holder exits (the
	// holder's parent is that thread; so are the jails it clones with
	// CLONE_PARENT): start it from a thread that never exits.
	go func() {
		runtime.LockOSThread()
		h, err := startHolderHere(base)
		ch <- started{h, err}
		if err == nil {
			<-make(chan struct{}) // keep this thread as long as the process
		}
		// (On failure the thread may go: nothing depends on it.)
	}()
	s := <-ch
	if s.err != nil {
		os.Remove(base)
		return nil, s.err
	}
	return s.h, nil
}

func startHolderHere(base string) (*quotaHolder, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	theirs := os.NewFile(uintptr(pair[1]), "quota-holder")
	defer theirs.Close()
	cmd, err := startInit(func(path string) *exec.Cmd {
		return ownUserNSCommand(path, theirs, holderArg0, base)
	})
	if err != nil {
		unix.Close(pair[0])
		return nil, fmt.Errorf("start the holder in a user namespace: %w", err)
	}
	theirs.Close()
	h := &quotaHolder{sock: pair[0], base: base, dead: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(h.dead)
		os.Remove(base) // (its mounts went with it)
	}()
	r, fd, err := h.receive()
	if err == nil && r.Error != "" {
		err = errors.New(r.Error)
	}
	if fd >= 0 {
		unix.Close(fd)
	}
	if err != nil {
		_ = cmd.Process.Kill()
		unix.Close(pair[0])
		return nil, fmt.Errorf("the holder: %w", err)
	}
	return h, nil
}

// request sends req with the descriptors files and returns the reply and
// the descriptor that came with it (-1 if none).
func (h *quotaHolder) request(req *holderRequest, files []*os.File) (holderReply, int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, err := json.Marshal(req)
	if err != nil {
		return holderReply{}, -1, err
	}
	var rights []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		rights = unix.UnixRights(fds...)
	}
	err = unix.Sendmsg(h.sock, b, rights, nil, 0)
	runtime.KeepAlive(files)
	if err != nil {
		return holderReply{}, -1, fmt.Errorf("the holder: %w", err)
	}
	r, fd, err := h.receive()
	if err == nil && r.Error != "" {
		err = errors.New(r.Error)
	}
	return r, fd, err
}

func (h *quotaHolder) receive() (holderReply, int, error) {
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(h.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		fd := -1
		if fds := receivedFDs(oob[:oobn]); len(fds) > 0 {
			fd = fds[0]
			for _, f := range fds[1:] {
				unix.Close(f)
			}
		}
		switch {
		case err != nil:
			return holderReply{}, fd, err
		case n == 0:
			return holderReply{}, fd, errors.New("the holder has exited")
		}
		var r holderReply
		if err := json.Unmarshal(buf[:n], &r); err != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			return holderReply{}, -1, err
		}
		return r, fd, nil
	}
}

// holderQuotaUnsupported says why workspaces cannot be tmpfs mounts held
// by a holder here, or "". It tries once per process.
var holderQuotaUnsupported = sync.OnceValue(func() string {
	if os.Geteuid() == 0 {
		return "not for root without CAP_SYS_ADMIN"
	}
	h, err := theHolder()
	if err != nil {
		return err.Error()
	}
	r, fd, err := h.request(&holderRequest{Op: "mount", Size: 1 << 20, Inodes: 16}, nil)
	if err != nil {
		return err.Error()
	}
	unix.Close(fd)
	if _, _, err := h.request(&holderRequest{Op: "unmount", Name: r.Name}, nil); err != nil {
		return err.Error()
	}
	return ""
})

// newHolderQuotaDir is NewQuotaDir with the holder: see the top of this
// file.
func newHolderQuotaDir(disk int64, files int) (*QuotaDir, error) {
	h, err := theHolder()
	if err != nil {
		return nil, fmt.Errorf("make the workspace's tmpfs: %w", err)
	}
	// nr_inodes counts the root and the workspace's directory too.
	r, fd, err := h.request(&holderRequest{Op: "mount", Size: disk, Inodes: files + 2}, nil)
	if err != nil {
		return nil, fmt.Errorf("make the workspace's tmpfs: %w", err)
	}
	if fd < 0 {
		return nil, errors.New("make the workspace's tmpfs: the holder sent no descriptor")
	}
	m := os.NewFile(uintptr(fd), "workspace-tmpfs")
	sub := "sandloop-ws-" + rand.Text()
	if err := unix.Mkdirat(int(m.Fd()), sub, 0o755); err != nil {
		m.Close()
		_, _, _ = h.request(&holderRequest{Op: "unmount", Name: r.Name}, nil)
		return nil, fmt.Errorf("make the workspace's directory: %w", err)
	}
	q := &QuotaDir{
		Path: "/proc/self/fd/" + strconv.Itoa(int(m.Fd())) + "/" + sub,
		Disk: disk, Files: files, Enforced: true,
		mount: m, sub: sub, overhead: 2,
		holderName: r.Name,
	}
	usernsDirs.Lock()
	usernsDirs.m[q.Path] = q
	usernsDirs.Unlock()
	return q, nil
}

// holderPath is the workspace's directory in the holder's (and its
// jails') mount namespace.
func (q *QuotaDir) holderPath(h *quotaHolder) string {
	return filepath.Join(h.base, q.holderName, q.sub)
}

// removeHolder forgets the workspace, closes its descriptor and has the
// holder detach its mount.
func (q *QuotaDir) removeHolder() error {
	usernsDirs.Lock()
	delete(usernsDirs.m, q.Path)
	usernsDirs.Unlock()
	q.mount.Close()
	h, err := theHolder()
	if err != nil {
		return err
	}
	select {
	case <-h.dead:
		return nil // its mounts went with it
	default:
	}
	if _, _, err := h.request(&holderRequest{Op: "unmount", Name: q.holderName}, nil); err != nil {
		return fmt.Errorf("unmount workspace: %w", err)
	}
	return nil
}

// spawn starts cmd as exec.Cmd.Start would, but through the holder: in a
// copy of its mount namespace, as this process's child. It returns the
// process and a function that waits for it (and for the copying of
// stdio that is not a file), as exec.Cmd.Wait.
func (h *quotaHolder) spawn(cmd *exec.Cmd) (*os.Process, func() (*os.ProcessState, error), error) {
	sys := cmd.SysProcAttr
	s := &spawnRequest{
		Path: cmd.Path, Args: cmd.Args, Env: cmd.Env,
		Cloneflags:                 sys.Cloneflags,
		GidMappingsEnableSetgroups: sys.GidMappingsEnableSetgroups,
		Credential:                 sys.Credential,
		AmbientCaps:                sys.AmbientCaps,
		Pdeathsig:                  sys.Pdeathsig,
		Setsid:                     sys.Setsid,
	}
	if sys.UseCgroupFD || sys.Unshareflags != 0 || sys.Chroot != "" || sys.Setpgid || sys.Setctty || sys.Foreground || sys.PidFD != nil {
		return nil, nil, errors.New("the holder cannot start this command") // (none of ours asks for these)
	}
	// The holder's user namespace maps our uid and gid as its 0.
	var err error
	if s.UidMappings, err = holderMappings(sys.UidMappings, os.Getuid()); err == nil {
		s.GidMappings, err = holderMappings(sys.GidMappings, os.Getgid())
	}
	if err != nil {
		return nil, nil, err
	}
	st, err := newHolderStdio(cmd)
	if err != nil {
		return nil, nil, err
	}
	files := append(st.child[:], cmd.ExtraFiles...)
	if len(files) > holderMaxFDs {
		st.abort()
		return nil, nil, fmt.Errorf("%d descriptors: at most %d", len(files), holderMaxFDs)
	}
	s.Files = len(files)
	r, fd, err := h.request(&holderRequest{Op: "spawn", Spawn: s}, files)
	if fd >= 0 {
		unix.Close(fd)
	}
	st.started()
	if err != nil {
		st.abort()
		return nil, nil, err
	}
	// It is our child, not yet waited for: its PID cannot have been
	// reused (os.FindProcess holds it by a pidfd from here on).
	proc, err := os.FindProcess(r.Pid)
	if err != nil {
		_ = unix.Kill(r.Pid, unix.SIGKILL)
		st.abort()
		return nil, nil, err
	}
	wait := func() (*os.ProcessState, error) {
		ps, err := proc.Wait()
		st.wait(cmd.WaitDelay)
		return ps, err
	}
	return proc, wait, nil
}

func holderMappings(m []syscall.SysProcIDMap, ours int) ([]syscall.SysProcIDMap, error) {
	out := make([]syscall.SysProcIDMap, len(m))
	for i, e := range m {
		if e.HostID != ours || e.Size != 1 {
			return nil, fmt.Errorf("the holder maps only id %d (asked for %d+%d)", ours, e.HostID, e.Size)
		}
		out[i] = syscall.SysProcIDMap{ContainerID: e.ContainerID, HostID: 0, Size: 1}
	}
	return out, nil
}

// holderStdio is a command's stdin, stdout and stderr as files, with
// pipes (and goroutines copying them) for readers and writers that are
// not files, as exec.Cmd makes.
type holderStdio struct {
	child   [3]*os.File
	closeAt []*os.File // the child's ends we made, closed once it started
	ours    []*os.File // our ends, closed after it ended
	copies  []chan struct{}
}

func newHolderStdio(cmd *exec.Cmd) (*holderStdio, error) {
	st := &holderStdio{}
	devNull := func() (*os.File, error) {
		f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err == nil {
			st.closeAt = append(st.closeAt, f)
		}
		return f, err
	}
	var err error
	switch r := cmd.Stdin.(type) {
	case nil:
		st.child[0], err = devNull()
	case *os.File:
		st.child[0] = r
	default:
		var pr, pw *os.File
		if pr, pw, err = os.Pipe(); err == nil {
			st.child[0] = pr
			st.closeAt = append(st.closeAt, pr)
			st.ours = append(st.ours, pw)
			go func() {
				_, _ = io.Copy(pw, r)
				pw.Close()
			}()
		}
	}
	for i, w := range []io.Writer{cmd.Stdout, cmd.Stderr} {
		if err != nil {
			break
		}
		if i == 1 && sameWriter(cmd.Stdout, cmd.Stderr) {
			st.child[2] = st.child[1] // one pipe, one copier, as exec.Cmd
			break
		}
		switch w := w.(type) {
		case nil:
			st.child[1+i], err = devNull()
		case *os.File:
			st.child[1+i] = w
		default:
			var pr, pw *os.File
			if pr, pw, err = os.Pipe(); err == nil {
				st.child[1+i] = pw
				st.closeAt = append(st.closeAt, pw)
				st.ours = append(st.ours, pr)
				done := make(chan struct{})
				st.copies = append(st.copies, done)
				go func() {
					_, _ = io.Copy(w, pr)
					close(done)
				}()
			}
		}
	}
	if err != nil {
		st.abort()
		return nil, err
	}
	return st, nil
}

func sameWriter(a, b io.Writer) (same bool) {
	defer func() { recover() }() // (uncomparable types)
	return a != nil && a == b
}

// started closes the child's ends: the child has its own.
func (st *holderStdio) started() {
	for _, f := range st.closeAt {
		f.Close()
	}
	st.closeAt = nil
}

// wait waits, after the child ended, for the output's copies (at most
// delay if nonzero: a grandchild may hold the pipe) and closes our ends.
func (st *holderStdio) wait(delay time.Duration) {
	var timeout <-chan time.Time
	if delay > 0 {
		timeout = time.After(delay)
	}
wait:
	for _, done := range st.copies {
		select {
		case <-done:
		case <-timeout:
			break wait
		}
	}
	for _, f := range st.ours {
		f.Close()
	}
}

func (st *holderStdio) abort() {
	st.started()
	st.wait(time.Nanosecond)
}
