package jail

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// initArg0 is argv[0] of the jail's init: the server re-executes its own
// binary under this name inside the new namespaces.
const initArg0 = "sandloop-jail-init"

// Descriptors handed to the init. The program's extra files follow.
const (
	initConfigFD    = 3 // init reads its initConfig (one JSON value: sendConfig)
	initStatusFD    = 4 // init writes one initStatus (JSON) and closes it
	initWorkspaceFD = 5 // the workspace's mount (open_tree) or /dev/null
	initFirstExtra  = 6
)

// initConfig is what the host tells the init.
type initConfig struct {
	Path       string
	Args       []string
	Env        []string
	Dir        string
	Limits     Limits
	Network    Network
	Files      []File
	ExtraFiles int
	// Workspace is the host path (resolved) of the workspace;
	// WorkspaceTree says the host passed a clone of its mount instead
	// (as root), to be attached rather than bound by path; WorkspaceSub
	// that it passed a tmpfs made in a user namespace, whose directory
	// WorkspaceSub the init clones and attaches.
	Workspace     string
	WorkspaceTree bool
	WorkspaceSub  string
	// RlimitOnly: no cgroup enforces memory/pids, so rlimits must.
	RlimitMemory bool
	RlimitPids   bool
	// ProgramPids, if set, is the program's own share of Limits.Pids (which
	// has room for the init's threads on top): the program is held to it
	// exactly by RLIMIT_NPROC, while the cgroup's pids.max, above it,
	// bounds the jail as a whole.
	ProgramPids int
	// NewCgroupNS: unshare the cgroup namespace once the host has moved
	// the init into its cgroup, so the jail sees its cgroup as "/".
	NewCgroupNS bool
	// Zygote, ZygoteWorkspaces: see Config (the directory resolved).
	Zygote           bool
	ZygoteWorkspaces string
	// ReceiveMounts: the holder started this zygote template; mounts it
	// makes later under ZygoteWorkspaces (workspaces) must propagate
	// into the template's view (see buildRoot).
	ReceiveMounts bool
	// ListenPort: see Config.ListenPort. The listener goes to the host
	// over the descriptor after the program's extra files.
	ListenPort int
	// Terminal: descriptors 0-2 are a pseudo-terminal (Config.Terminal),
	// to be made the program's controlling terminal.
	Terminal bool
	// Mounts: see Config.Mounts. FD, if nonzero, is the descriptor of a
	// clone of the directory's mount (open_tree) to attach; otherwise the
	// init binds Host by its path.
	Mounts []initMount

	// sysRoot is where the system directories come from while the root
	// is built (oldRoot, or imageDir for a Root mount); sysRootFD, for an
	// image, is its directory, in which its /etc is resolved.
	sysRoot   string
	sysRootFD int
}

type initMount struct {
	Host     string
	Path     string
	Writable bool
	Root     bool
	FD       int
}

// initStatus is one of the init's reports, one JSON object per line: first
// that the program started (Pid) or that setup failed (Error), then, when
// the program has ended, how it ended (Exited).
type initStatus struct {
	Pid      int    `json:"pid,omitempty"`
	Error    string `json:"error,omitempty"`
	Exited   bool   `json:"exited,omitempty"`
	ExitCode int    `json:"code,omitempty"`
	Signal   int    `json:"signal,omitempty"`
}

// MaybeInit runs the jail's init and exits if this process was started as
// one; otherwise it returns at once. Call it first thing in main (and in
// TestMain of packages that start jails).
func MaybeInit() {
	if len(os.Args) > 0 && os.Args[0] == quotaArg0 {
		os.Exit(runQuotaHelper())
	}
	if len(os.Args) > 0 && os.Args[0] == holderArg0 {
		os.Exit(runHolder())
	}
	if len(os.Args) > 0 && os.Args[0] == joinArg0 {
		// Credentials, the bounding set and securebits are per thread:
		// set up and execute the program from one thread.
		runtime.LockOSThread()
		os.Exit(runJoin())
	}
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	// Namespaces, capabilities and the bounding set are per thread: do all
	// of the setup, and the fork of the program, from one thread.
	runtime.LockOSThread()
	os.Exit(runInit())
}

func runInit() int {
	status := os.NewFile(initStatusFD, "status")
	enc := json.NewEncoder(status)
	report := func(st initStatus) { _ = enc.Encode(st) }
	var cfg initConfig
	cf := os.NewFile(initConfigFD, "config")
	if err := readConfig(cf, &cfg); err != nil {
		report(initStatus{Error: "read config: " + err.Error()})
		return 126
	}
	cf.Close()
	pid, err := setupAndStart(&cfg)
	if err != nil {
		report(initStatus{Error: err.Error()})
		return 126
	}
	// The program has its own copies of the workspace mount and the extra
	// files: the init keeps none, so when the program closes one, it is
	// closed for whoever holds the other end.
	// (Only these: the Go runtime has descriptors of its own, e.g. epoll.)
	unix.Close(initWorkspaceFD)
	for i := range cfg.ExtraFiles {
		unix.Close(initFirstExtra + i)
	}
	report(initStatus{Pid: pid})
	st := superviseChild(pid)
	report(st)
	if cfg.Zygote {
		reapAll() // the zygote's children live on in this PID namespace
	}
	if st.Signal != 0 {
		return 128 + st.Signal
	}
	return st.ExitCode
}

// sendConfig writes v to a pipe whose reader decodes one JSON value
// from it and then closes its end (the init's readConfig, runJoin): the
// value and not a byte more. A byte after the value (json.Encoder's
// newline) would be written after the reader had what it needed, and
// whenever the pipe's buffer split the write just before that byte (a
// value of a multiple of 64 KiB, as a zygote template's configuration
// with its files can be), the reader could have closed its end by then:
// the write failed with EPIPE and the jail did not start.
func sendConfig(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// readConfig reads the init's configuration (sendConfig's value).
func readConfig(r io.Reader, cfg *initConfig) error {
	return json.NewDecoder(r).Decode(cfg)
}

func setupAndStart(cfg *initConfig) (int, error) {
	if cfg.NewCgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return 0, fmt.Errorf("unshare cgroup namespace: %w", err)
		}
	}
	if err := buildRoot(cfg); err != nil {
		return 0, err
	}
	if err := unix.Sethostname([]byte("sandbox")); err != nil {
		return 0, fmt.Errorf("sethostname: %w", err)
	}
	if cfg.Network != NetworkHost {
		if err := loopbackUp(); err != nil {
			return 0, fmt.Errorf("bring up loopback: %w", err)
		}
	}
	if cfg.ListenPort != 0 {
		if err := handOffListener(cfg.ListenPort, initFirstExtra+cfg.ExtraFiles); err != nil {
			return 0, fmt.Errorf("listen on the jail's loopback: %w", err)
		}
	}
	if err := setRlimits(cfg); err != nil {
		return 0, err
	}
	if err := defaultIgnoredSignals(); err != nil {
		return 0, err
	}
	// Descriptors the init inherited from whoever started the server must
	// not reach the program: only 0-2 and the extra files are handed on
	// (ForkExec clears close-on-exec on exactly those).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, fmt.Errorf("close_range: %w", err)
	}
	if cfg.Zygote {
		// The template keeps its capabilities (in this user namespace
		// only) to build each child's jail; each child drops them and
		// loads the filter before it runs anything else.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return 0, fmt.Errorf("set no_new_privs: %w", err)
		}
	} else {
		if err := dropPrivileges(); err != nil {
			return 0, err
		}
		if err := loadSeccomp(); err != nil {
			return 0, err
		}
	}
	files := []uintptr{0, 1, 2}
	for i := range cfg.ExtraFiles {
		files = append(files, uintptr(initFirstExtra+i))
	}
	args := cfg.Args
	if len(args) == 0 {
		args = []string{cfg.Path}
	}
	attr := &syscall.ProcAttr{
		Dir:   cfg.Dir,
		Env:   cfg.Env,
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setsid:    true,
			Pdeathsig: syscall.SIGKILL,
			// In its new session, the terminal on its stdin becomes the
			// program's controlling terminal (TIOCSCTTY): job control,
			// ^C as SIGINT, SIGWINCH on a resize, /dev/tty.
			Setctty: cfg.Terminal,
			Ctty:    0,
		},
	}
	forwardSignals()
	if cfg.ProgramPids > 0 {
		warmThreads()
	}
	pid, err := forkWithRlimits(func() []rlimit { return programRlimits(cfg) }, func() (int, error) {
		return syscall.ForkExec(cfg.Path, args, attr)
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", cfg.Path, err)
	}
	return pid, nil
}

// kernelSigaction is the kernel's struct sigaction on amd64 and arm64,
// for rt_sigaction(2) itself: glibc's wrapper refuses signals 32 and 33,
// and the Go runtime leaves those two (and SIGHUP and SIGINT) as it found
// them.
// The handlers rt_sigaction(2) takes for "default" and "ignore".
const (
	sigDfl = 0
	sigIgn = 1
)

type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// defaultIgnoredSignals sets every signal this process inherited ignored
// back to its default, so that the program does not inherit it ignored
// either (exec keeps SIG_IGN): a server started with signals ignored, as
// GNU make starts its children with 32 and 33, must not hand that on to
// sandboxed programs. The join program does the same (join.c).
func defaultIgnoredSignals() error {
	for s := 1; s <= 64; s++ {
		if s == int(unix.SIGKILL) || s == int(unix.SIGSTOP) {
			continue
		}
		var old kernelSigaction
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s), 0, uintptr(unsafe.Pointer(&old)), 8, 0, 0); e != 0 {
			continue // not a signal this kernel has
		}
		if old.handler != sigIgn {
			continue
		}
		dfl := kernelSigaction{handler: sigDfl}
		if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(s), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); e != 0 {
			return fmt.Errorf("reset signal %d: %w", s, e)
		}
	}
	return nil
}

// reapAll reaps every process left in the jail until none is.
func reapAll() {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return
		}
	}
}

// programPid is the program's pid once it is started (0 before), and
// programStarted is closed then.
var (
	programPid     atomic.Int64
	programStarted = make(chan struct{})
)

// forwardSignals sends the signals the host sends the init on to the
// program; those that come before it starts wait for it. It is set up
// before the program starts, so that the threads it needs exist by then
// (see warmThreads).
func forwardSignals() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	go func() {
		<-programStarted
		for s := range sigs {
			_ = unix.Kill(int(programPid.Load()), s.(unix.Signal))
		}
	}()
}

// warmThreads gives the init, before it starts the program, every thread
// it will need while it supervises, so that its thread count cannot grow
// afterwards: the program's NPROC limit counts the init's threads as they
// are when it starts (programRlimits), and a thread the init started later
// would come out of the program's share (under load the Go runtime used to
// start one or two more as the program ran, so `--pids 10` allowed 7 more
// processes rather than 9).
//
// It runs the init on one processor (GOMAXPROCS 1): at most one of its
// threads then runs Go code, and the others it may need at once are those
// blocked in system calls (wait4, a signal's kill, a pipe's write, the
// runtime's own). Then it makes warmThreadCount threads exist at once, for
// sure: as many goroutines each lock themselves to a thread of their own
// and wait until all are locked, which the runtime can satisfy only with
// that many distinct threads. They unlock before they end, so the threads
// are kept, idle, for later (the runtime takes an idle thread before it
// starts a new one; one that ends locked would be ended). The runtime's
// own threads (sysmon, the template thread that starts threads for a
// locked one, as the init's main thread is) exist by then too.
func warmThreads() {
	runtime.GOMAXPROCS(1)
	var locked, done sync.WaitGroup
	release := make(chan struct{})
	for range warmThreadCount {
		locked.Add(1)
		done.Go(func() {
			runtime.LockOSThread()
			locked.Done()
			<-release
			runtime.UnlockOSThread()
		})
	}
	locked.Wait()
	close(release)
	done.Wait()
}

// warmThreadCount is how many threads warmThreads makes besides the
// init's main one (blocked in wait4 while it supervises): more than the
// init can need at once on one processor (one running, the signal
// forwarder's kill, a write to the host, the runtime's scavenger).
const warmThreadCount = 4

// superviseChild forwards signals from the host to the program, reaps
// every process that ends in the jail, and returns the program's exit
// status. When the init returns, the kernel kills whatever is left in the
// PID namespace (daemons included).
func superviseChild(pid int) initStatus {
	programPid.Store(int64(pid))
	close(programStarted)
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return initStatus{Exited: true, ExitCode: 125}
		}
		if got != pid {
			continue
		}
		switch {
		case ws.Exited():
			return initStatus{Exited: true, ExitCode: ws.ExitStatus()}
		case ws.Signaled():
			return initStatus{Exited: true, Signal: int(ws.Signal())}
		}
	}
}
