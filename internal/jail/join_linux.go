package jail

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Joining a running jail (Config.Join): a process started inside the
// namespaces, root, cgroup and filter of a jail that already runs, as
// nsenter would, so that it shares the jail's /tmp, loopback, processes
// and limits with the program already there.
//
// Entering a user namespace (and a mount namespace) takes a
// single-threaded process, which a Go program never is, so the entering
// is done by a few lines of Python (joinScript, run by the host's
// python3 -I -S, the interpreter jails run anyway) and the rest by the
// jail's own init program re-executed in join mode (runJoin):
//
//  1. the host opens a pidfd of the jail's PID 1 (JoinTarget; a recycled
//     PID can never redirect it) and its root, and starts the script;
//     while the interpreter starts, the host moves the script into the
//     jail's cgroup, then tells it to go on (a newline on the
//     configuration pipe) and writes runJoin's configuration after it;
//     the script enters nothing before that newline, so its child, and
//     every process of the program's, is born in the cgroup;
//  2. the script enters every namespace of that process at once
//     (setns on the pidfd: user, mount, PID, network, IPC, UTS, cgroup,
//     less those it shares with the host already), chroots to its root
//     and forks once, so the child is in the jail's PID namespace (the
//     parent stays on the host's side, only to wait for it and report
//     how it ended);
//  3. the child takes the sandbox's uid and gid, keeps CAP_SETPCAP
//     ambient (in the jail's user namespace) only so that the next
//     program can empty the bounding set, and executes the init program
//     by descriptor (nothing of the jail's is executed yet);
//  4. runJoin reads its setup (the jail's limits, whether there is a
//     terminal), sets the rlimits, starts a session of its own (a
//     process group the host kills as one), drops every capability and
//     locks the securebits, loads the jail's seccomp filter and reports
//     {prepared}; then it reads its program (joinCommand), changes to its
//     directory, sets its last rlimits and executes it: the same steps,
//     from the same code, as the program of a new jail.
//
// A join can be made ahead of its command (PrepareJoin, joiner_linux.go):
// steps 1-4 up to {prepared}, so that the command costs the program's
// exec and a few syscalls. What it holds while it waits is said there.
//
// The script on the host's side is in the jail's cgroup while the
// program runs (one process of the jail's Pids limit, its memory charged
// to the jail's, killed with the jail's group): nothing in the jail can
// see or signal it (it is in no namespace of the jail's), and moving it
// early keeps the move off the command's critical path: it sleeps
// ~10 ms in the kernel (measured: one context switch, no CPU; cgroup
// v1's migration lock waits for an RCU grace period), which now passes
// while the interpreter starts.
//
// Where a joined command's time goes (BenchmarkJoinStages, `true` at
// load ~8 on 2 cores, 35-37 ms, was 50-72 ms; a host fork/exec of `true`
// is ~1 ms): the interpreter's start, its ctypes import, setns and the
// fork (13-15 ms; the json module is no longer imported: its re and enum
// cost ~9 ms), the cgroup move (6-10 ms, in parallel with that start),
// the init's start and runJoin (8-10 ms), the end's report (~4 ms). A
// join made ahead (Joiner) leaves the exec and the end's report: 4-5 ms
// for `true` at load ~5 against 29-63 ms joining in the same run (15-22
// ms against 114-138 at load ~12), most of it wake-ups of the processes
// that hand over (host, runJoin, the program, the script reporting the
// end).
//
// The jail's PID 1 becomes the parent of whatever the program leaves
// running when it ends (a `nohup server &`), reaps it, and ends it when
// the jail ends: the kernel kills a PID namespace's every process when
// its PID 1 exits, and the jail's cgroup is killed with it.

// JoinTarget is a running jail that processes can join (Config.Join).
// Close it when done: it holds a descriptor of the jail's PID 1.
type JoinTarget struct {
	pidfd   int
	pid     int
	cg      *cgroup
	enforce string
	limits  Limits // the jail's, with defaults
	// nproc: the jail's program has an RLIMIT_NPROC of its Pids and its
	// init's threads (a jail of its own, in a user namespace of its own).
	// A zygote's sessions share the template's user namespace, where
	// NPROC would count every session's processes: their cgroup counts.
	nproc bool
}

// NewJoinTarget makes a target of the jail whose PID 1 pidfd refers to
// (pid is its host PID; the descriptor is duplicated, the caller keeps
// its own), with limits l, in group g (nil where no cgroup enforces
// them): a zygote's session, whose user namespace is the template's and
// shared with its siblings (no RLIMIT_NPROC: its group counts).
func NewJoinTarget(pidfd, pid int, l Limits, g *Group) (*JoinTarget, error) {
	fd, err := unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("join target: %w", err)
	}
	t := &JoinTarget{pidfd: fd, pid: pid, enforce: "rlimits", limits: l.WithDefaults()}
	if g != nil {
		t.cg = g.cg
		t.enforce = g.cg.mode
	}
	return t, nil
}

// JoinTarget returns a target of this jail (see Config.Join).
func (p *Process) JoinTarget() (*JoinTarget, error) {
	if p.joinPid != 0 {
		return nil, errors.New("jail: a joined process is not a jail of its own")
	}
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		return nil, os.ErrProcessDone
	}
	// The PID was this jail's init when the descriptor was opened if the
	// network namespace is still the one it was born in.
	if ino, err := netnsInode(p.pid); err != nil || (p.netns != 0 && ino != p.netns) || unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
		unix.Close(fd)
		return nil, os.ErrProcessDone
	}
	return &JoinTarget{pidfd: fd, pid: p.pid, cg: p.cg, enforce: p.enforce, limits: p.limits, nproc: true}, nil
}

// Close releases the target's descriptor.
func (t *JoinTarget) Close() error {
	if t == nil || t.pidfd < 0 {
		return nil
	}
	err := unix.Close(t.pidfd)
	t.pidfd = -1
	return err
}

// joinArg0 is argv[0] of the init program in join mode (runJoin).
const joinArg0 = "sandloop-jail-join"

// Descriptors of the join script, and of runJoin after it.
const (
	joinPidFD    = 3 // the target's pidfd (script only)
	joinRootFD   = 4 // the target's root, O_PATH (script only)
	joinExeFD    = 5 // the init program, executed by descriptor (script only)
	joinConfigFD = 6 // runJoin reads its joinSetup, then its joinCommand (JSON)
	joinStatusFD = 7 // initStatus lines: the script's {pid}, runJoin's {prepared}, {ready} or {error}, the script's {exited}
)

// joinSetup is what runJoin needs before its program is known: the
// jail's limits (Timeout is the host's), whether the program gets a
// terminal, and the rlimits the program gets on top of setRlimits'
// (DATA, NPROC). joinCommand follows it, at once or, for a Joiner, when a
// command comes.
type joinSetup struct {
	Limits   Limits
	Terminal bool
	Extra    []joinRlimit
}

// joinCommand is the program runJoin executes.
type joinCommand struct {
	Path string
	Args []string
	Env  []string
	Dir  string
}

type joinRlimit struct {
	Name string
	Res  int
	Val  uint64
}

// joinStatus is a line of the join's status pipe.
type joinStatus struct {
	initStatus
	// Prepared: runJoin is set up, its program's limits and confinement
	// in place, and waits for its joinCommand.
	Prepared bool  `json:"prepared,omitempty"`
	Ready    bool  `json:"ready,omitempty"`
	CPUMs    int64 `json:"cpu_ms,omitempty"`
	MaxRSS   int64 `json:"maxrss_kb,omitempty"`
}

// joinScript enters the target's namespaces (argv: flags, uid, gid) and
// forks the child that becomes the program. It imports before it enters:
// nothing of the jail's is read after that.
const joinScript = `
import ctypes, os, sys
PIDFD, ROOT, EXE, CONFIG, STATUS = 3, 4, 5, 6, 7
# A JSON object of ints, true and strings, written by hand: the json
# module's imports (re, enum) cost more than the rest of the script.
def quote(v):
    return '"' + "".join(c if " " <= c < "\x7f" and c not in '"\\' else "\\u%04x" % min(ord(c), 0xfffd) for c in str(v)) + '"'
def report(**kw):
    fields = ('"%s":%s' % (k, "true" if v is True else str(v) if type(v) is int else quote(v)) for k, v in kw.items())
    os.write(STATUS, ("{" + ",".join(fields) + "}\n").encode())
libc = ctypes.CDLL(None, use_errno=True)
flags, uid, gid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    # Nothing is entered until the host has moved this process into the
    # jail's cgroup (where the child is then born) and says so: a
    # newline before the configuration.
    if os.read(CONFIG, 1) != b"\n":
        raise OSError("no configuration")
    if flags and libc.setns(PIDFD, flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "enter the sandbox's namespaces: " + os.strerror(e))
    os.fchdir(ROOT)
    os.chroot(".")
    os.chdir("/")
    # The child goes on once its PID is reported: the host knows what to
    # kill before anything of the program's can run.
    hold, go = os.pipe()
    pid = os.fork()
except OSError as e:
    report(error=str(e))
    sys.exit(126)
if pid == 0:
    try:
        os.close(PIDFD); os.close(ROOT); os.close(go)
        if os.read(hold, 1) != b"g":
            raise OSError("the join was abandoned")
        os.close(hold)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        # CAP_SETPCAP (8), inheritable then ambient: the init empties the
        # bounding set with it, then drops it with every other.
        hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        if libc.capget(hdr, data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        data[2] |= 1 << 8
        if libc.capset(hdr, data) != 0:
            raise OSError(ctypes.get_errno(), "capset")
        if libc.prctl(47, 2, 8, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "raise ambient CAP_SETPCAP")
        os.execve(EXE, [sys.argv[4]], {})
    except BaseException as e:
        try:
            report(error="join: " + str(e))
        finally:
            os._exit(126)
os.close(PIDFD); os.close(ROOT); os.close(EXE); os.close(CONFIG)
for fd in (0, 1, 2):
    os.close(fd)
report(pid=pid)
os.write(go, b"g")
os.close(go); os.close(hold)
_, st, ru = os.wait4(pid, 0)
out = {"exited": True, "cpu_ms": int((ru.ru_utime + ru.ru_stime) * 1000), "maxrss_kb": ru.ru_maxrss}
if os.WIFSIGNALED(st):
    out["signal"] = os.WTERMSIG(st)
else:
    out["code"] = os.WEXITSTATUS(st)
report(**out)
os._exit(0)
`

// joinFlags are the namespaces of pid that the host does not share
// already (a jail on the host's network shares its network namespace;
// one without cgroups its cgroup namespace): those are entered, the rest
// are the same already.
func joinFlags(pid int) int {
	all := []struct {
		name string
		flag int
	}{
		{"user", unix.CLONE_NEWUSER}, {"mnt", unix.CLONE_NEWNS}, {"pid", unix.CLONE_NEWPID},
		{"net", unix.CLONE_NEWNET}, {"ipc", unix.CLONE_NEWIPC}, {"uts", unix.CLONE_NEWUTS},
		{"cgroup", unix.CLONE_NEWCGROUP},
	}
	flags := 0
	for _, ns := range all {
		var ours, theirs unix.Stat_t
		if unix.Stat("/proc/self/ns/"+ns.name, &ours) == nil && unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, ns.name), &theirs) == nil &&
			ours.Ino == theirs.Ino && ours.Dev == theirs.Dev {
			continue
		}
		flags |= ns.flag
	}
	return flags
}

// joining is a join started (the join program, or the script), and our
// ends of its pipes.
type joining struct {
	cmd    *exec.Cmd
	prog   bool     // the join program (joinexe/join.c): its wire format, not JSON
	cfgW   *os.File // the go-ahead newline, then runJoin's setup and command
	stR    *os.File
	status *bufio.Reader
	outs   []*drain
	cg     *cgroup
	// What the script and runJoin reported so far (await).
	joinPid         int
	prepared, ready bool
}

// spawnJoin starts the join program (or, without it, the join script)
// for t, its standard descriptors stdin, stdout and stderr (nil:
// /dev/null). It enters nothing before enter.
func spawnJoin(t *JoinTarget, stdin, stdout, stderr *os.File) (*joining, error) {
	flags := joinFlags(t.pid)
	root, err := os.OpenFile(fmt.Sprintf("/proc/%d/root", t.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil || unix.PidfdSendSignal(t.pidfd, 0, nil, 0) != nil {
		if root != nil {
			root.Close()
		}
		return nil, fmt.Errorf("join the sandbox: %w", os.ErrProcessDone)
	}
	defer root.Close()
	// A copy for the script: the target keeps its own.
	dup, err := unix.FcntlInt(uintptr(t.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("join the sandbox: %w", err)
	}
	pidfd := os.NewFile(uintptr(dup), "jail-pidfd")
	defer pidfd.Close()
	prog := joinProgPath()
	var exe *os.File // the init, for the script (nil: fd 5 is not open)
	if prog == "" {
		if exe, err = os.Open(initPath()); err != nil {
			return nil, fmt.Errorf("join the sandbox: the init program: %w", err)
		}
		defer exe.Close()
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cfgR.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		cfgW.Close()
		return nil, err
	}
	defer stW.Close()
	cmd := &exec.Cmd{
		Path:       DefaultPython,
		Args:       []string{"python3", "-I", "-S", "-c", joinScript, strconv.Itoa(flags), strconv.Itoa(SandboxUID), strconv.Itoa(SandboxGID), joinArg0},
		Env:        []string{},
		ExtraFiles: []*os.File{pidfd, root, exe, cfgR, stW},
		SysProcAttr: &syscall.SysProcAttr{
			Pdeathsig: syscall.SIGKILL,
			Setsid:    true,
		},
		WaitDelay: 2 * time.Second,
	}
	if prog != "" {
		cmd.Path = prog
		cmd.Args = []string{"sandloop-join", joinProgVersion, strconv.Itoa(flags), strconv.Itoa(SandboxUID), strconv.Itoa(SandboxGID)}
	}
	// Unset, not a nil *os.File: exec gives /dev/null then.
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if stderr != nil {
		cmd.Stderr = stderr
	}
	if err := cmd.Start(); err != nil {
		cfgW.Close()
		stR.Close()
		if prog != "" && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOEXEC)) {
			// The cached program cannot be executed here (a noexec
			// mount): the script from now on.
			giveUpJoinProgram(err)
			return spawnJoin(t, stdin, stdout, stderr)
		}
		return nil, fmt.Errorf("join the sandbox: %w", err)
	}
	return &joining{cmd: cmd, prog: prog != "", cfgW: cfgW, stR: stR, status: bufio.NewReader(io.LimitReader(stR, 1<<20)), cg: t.cg}, nil
}

// joinProgVersion is the protocol of the join program (join.c's VERSION):
// a program of another refuses to start.
const joinProgVersion = "1"

// joinFilterHex is the jail's seccomp filter (SeccompFilter) in hex, for
// the join program.
var joinFilterHex = sync.OnceValues(func() (string, error) {
	f, err := SeccompFilter()
	return hex.EncodeToString(f), err
})

// progMessage is a message of the join program's configuration: a length
// in native byte order, then fields, each ended by a NUL.
func progMessage(fields ...string) []byte {
	n := 0
	for _, f := range fields {
		n += len(f) + 1
	}
	b := binary.NativeEndian.AppendUint32(make([]byte, 0, 4+n), uint32(n))
	for _, f := range fields {
		b = append(append(b, f...), 0)
	}
	return b
}

// encode is s as the join program reads it (join.c: setup).
func (s joinSetup) encode() ([]byte, error) {
	filter, err := joinFilterHex()
	if err != nil {
		return nil, err
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	term := "0"
	if s.Terminal {
		term = "1"
	}
	f := []string{u(uint64(s.Limits.NoFile)), u(uint64(s.Limits.FileSize)), u(uint64(s.Limits.Stack)), term, strconv.Itoa(len(s.Extra))}
	for _, r := range s.Extra {
		f = append(f, r.Name, strconv.Itoa(r.Res), u(r.Val))
	}
	return progMessage(append(f, filter)...), nil
}

// encode is c as the join program reads it (join.c: command). Its fields
// hold no NUL (checkCommand).
func (c joinCommand) encode() []byte {
	f := make([]string, 0, 4+len(c.Args)+len(c.Env))
	f = append(f, c.Path, c.Dir, strconv.Itoa(len(c.Args)))
	f = append(f, c.Args...)
	f = append(f, strconv.Itoa(len(c.Env)))
	return progMessage(append(f, c.Env...)...)
}

// checkCommand refuses a program, argument, variable or directory with a
// NUL byte, which no exec can pass.
func checkCommand(cfg *Config) error {
	for _, f := range []struct {
		name string
		vals []string
	}{{"path", []string{cfg.Path}}, {"args", cfg.Args}, {"env", cfg.Env}, {"dir", []string{cfg.Dir}}} {
		for _, v := range f.vals {
			if strings.IndexByte(v, 0) >= 0 {
				return &ArgumentError{f.name, fmt.Errorf("%q holds a NUL byte", v)}
			}
		}
	}
	return nil
}

// setup is runJoin's setup for a program in t, and the warnings of its
// result.
func (t *JoinTarget) setup(terminal bool) (joinSetup, []string) {
	s := joinSetup{Limits: t.limits, Terminal: terminal}
	s.Limits.Timeout = 0 // the host's to enforce
	switch {
	case t.cg == nil:
		// No cgroup: the program's memory and processes are held by
		// rlimits, as a new jail's program is (programRlimits).
		s.Extra = []joinRlimit{{"DATA", unix.RLIMIT_DATA, uint64(t.limits.Memory)}, {"NPROC", unix.RLIMIT_NPROC, uint64(t.limits.Pids)}}
		return s, []string{RlimitsWarning}
	case t.nproc:
		// The NPROC a new jail's program gets: its share, plus room for
		// the init's threads (counted with it in the user namespace).
		s.Extra = []joinRlimit{{"NPROC", unix.RLIMIT_NPROC, uint64(t.limits.Pids + initThreads)}}
	}
	return s, nil
}

// enter moves the script into the jail's cgroup, then lets it enter the
// jail and sends runJoin its setup. The move waits for an RCU grace
// period of the kernel's (~10 ms under cgroup v1's percpu lock), which
// passes as the interpreter starts.
func (j *joining) enter(s joinSetup) error {
	if j.cg != nil {
		if err := j.cg.add(j.cmd.Process.Pid); err != nil {
			return fmt.Errorf("join the sandbox's cgroup: %w", err)
		}
	}
	msg := []byte("\n")
	if j.prog {
		setup, err := s.encode()
		if err != nil {
			return fmt.Errorf("configure the joined process: %w", err)
		}
		msg = append(msg, setup...)
	} else {
		b, err := json.Marshal(&s)
		if err != nil {
			return fmt.Errorf("configure the joined process: %w", err)
		}
		msg = append(append(msg, b...), '\n')
	}
	// One write, which a pipe's buffer holds: the setup is read as soon
	// as the child is forked.
	if _, err := j.cfgW.Write(msg); err != nil {
		return fmt.Errorf("join the sandbox: %w", err)
	}
	return nil
}

// send sends runJoin its program, the last of its configuration.
func (j *joining) send(c joinCommand) error {
	defer j.cfgW.Close()
	if j.prog {
		if _, err := j.cfgW.Write(c.encode()); err != nil {
			return fmt.Errorf("configure the joined process: %w", err)
		}
		return nil
	}
	if err := json.NewEncoder(j.cfgW).Encode(&c); err != nil {
		return fmt.Errorf("configure the joined process: %w", err)
	}
	return nil
}

// command is cfg as runJoin executes it.
func joinCommandOf(cfg *Config) joinCommand {
	c := joinCommand{Path: cfg.Path, Args: cfg.Args, Env: buildEnv(cfg.Env), Dir: cfg.Dir}
	if len(c.Args) == 0 {
		c.Args = []string{cfg.Path}
	}
	if c.Dir == "" {
		c.Dir = WorkspaceDir
	}
	return c
}

// await reads the join's reports until the script has reported its
// child's PID and runJoin its {ready} (ready) or its {prepared}: the
// script lets its child go on only once it has reported.
func (j *joining) await(ready bool) error {
	for j.joinPid == 0 || ready && !j.ready || !ready && !j.prepared {
		var st joinStatus
		if err := readJoinStatus(j.status, &st); err != nil {
			return fmt.Errorf("join the sandbox: %w", err)
		}
		switch {
		case st.Error != "":
			return fmt.Errorf("join the sandbox: %s", st.Error)
		case st.Pid != 0 && j.joinPid == 0:
			traceJoin("pid")
			j.joinPid = st.Pid
		case st.Prepared && !j.prepared:
			j.prepared = true
		case st.Ready && !j.ready:
			j.ready = true
		default:
			// {exited} before {ready}, or a report twice.
			return errors.New("join the sandbox: the process ended before it started (is the sandbox at its process or memory limit?)")
		}
	}
	return nil
}

// kill kills the script and its child: the script's group, and the
// child's once it leads one of its own (runJoin's setsid).
func (j *joining) kill() {
	if j.joinPid != 0 {
		_ = unix.Kill(-j.joinPid, unix.SIGKILL)
		_ = unix.Kill(j.joinPid, unix.SIGKILL)
	}
	_ = unix.Kill(-j.cmd.Process.Pid, unix.SIGKILL)
	_ = j.cmd.Process.Kill()
}

// wait waits for the script, then for what the program wrote before it
// ended (a little while: a job it left may hold the pipes for good).
func (j *joining) wait() (*os.ProcessState, error) {
	err := j.cmd.Wait()
	deadline := time.Now().Add(500 * time.Millisecond)
	for _, d := range j.outs {
		t := time.NewTimer(max(time.Until(deadline), 0))
		select {
		case <-d.done:
		case <-t.C:
		}
		t.Stop()
		d.stop()
	}
	return j.cmd.ProcessState, err
}

// abandon kills a join that never started its program and releases it.
// The script is let end by itself: with its configuration closed, it, or
// runJoin, reads its end and exits; runJoin (and a program already
// executed) is killed. The script then reaps its child and ends. Killed
// first, it would leave its child to the host's init (the reaper of the
// script's namespace, not the jail's), a zombie that the jail's end then
// waits for (~1 s here). It is killed only if it has not ended in a while.
func (j *joining) abandon() {
	j.cfgW.Close()
	if j.joinPid != 0 {
		_ = unix.Kill(-j.joinPid, unix.SIGKILL)
		_ = unix.Kill(j.joinPid, unix.SIGKILL)
	}
	t := time.AfterFunc(2*time.Second, j.kill)
	defer t.Stop()
	_, _ = j.wait()
	j.stR.Close()
}

// process makes p the joined program of j.
func (j *joining) process(p *Process) {
	p.proc = osProcess{j.cmd.Process}
	p.pid = j.cmd.Process.Pid
	p.waitProc = j.wait
	p.statusF = j.stR
	p.status = j.status
	p.joinPid = j.joinPid
	p.joinGroup = j.cg != nil
}

// outPipe is a pipe for a joined program's output to w, drained until
// every writer is gone: a job it left running (`nohup server &`) keeps
// writing after the program's end, and must not die of a closed pipe;
// what it writes then is discarded. It returns the write end.
func outPipe(w io.Writer) (*os.File, *drain, error) {
	r, wf, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	d := &drain{w: w, done: make(chan struct{})}
	go d.run(r)
	return wf, d, nil
}

// startJoined starts cfg inside cfg.Join's jail, under the jail's limits
// but for timeout's.
func startJoined(ctx context.Context, cfg *Config, timeout time.Duration) (*Process, error) {
	t := cfg.Join
	if t.pidfd < 0 {
		return nil, &ArgumentError{"join", errors.New("the target is closed")}
	}
	if err := checkCommand(cfg); err != nil {
		return nil, err
	}
	p := &Process{done: make(chan struct{}), enforce: t.enforce, network: NetworkNone}
	fail := func(err error) (*Process, error) {
		p.closeStdin()
		if p.tty != nil {
			p.tty.Close()
		}
		return nil, err
	}
	var stdin, ttySlave *os.File
	var err error
	if cfg.Terminal != nil {
		if p.tty, ttySlave, err = openTerminal(*cfg.Terminal); err != nil {
			return fail(err)
		}
		defer ttySlave.Close()
		p.ttyDone = make(chan struct{})
	} else {
		if stdin, err = p.stdinPipe(cfg.Stdin); err != nil {
			return fail(err)
		}
		if p.stdin != nil {
			defer stdin.Close()
		}
	}
	var outs []*drain
	var outW [2]*os.File
	defer func() {
		for _, f := range outW {
			if f != nil {
				f.Close() // the script's copies are the writers
			}
		}
	}()
	for i, w := range []io.Writer{cfg.Stdout, cfg.Stderr} {
		if w == nil || cfg.Terminal != nil {
			continue
		}
		wf, d, err := outPipe(w)
		if err != nil {
			return fail(err)
		}
		outW[i] = wf
		outs = append(outs, d)
	}
	if ttySlave != nil {
		stdin, outW[0], outW[1] = ttySlave, ttySlave, ttySlave
	}
	j, err := spawnJoin(t, stdin, outW[0], outW[1])
	if ttySlave != nil {
		outW = [2]*os.File{}
	}
	if err != nil {
		for _, d := range outs {
			d.stop()
		}
		return fail(err)
	}
	j.outs = outs
	setup, warn := t.setup(cfg.Terminal != nil)
	p.warn = warn
	traceJoin("started")
	// Into the jail's cgroup before it enters the jail and forks (the
	// child, and all of the program's, are born there), in a goroutine:
	// the move's wait passes as the interpreter starts.
	moved, configured := make(chan error, 1), make(chan error, 1)
	go func() {
		if err := j.enter(setup); err != nil {
			j.cfgW.Close()
			moved <- err
			configured <- nil
			return
		}
		moved <- nil
		configured <- j.send(joinCommandOf(cfg))
	}()
	j.process(p)
	p.start = time.Now()
	if p.tty != nil {
		ttySlave.Close()
		p.serveTerminal(cfg.Stdin, cfg.Stdout)
	}
	configDone := false
	abort := func(err error) (*Process, error) {
		if !configDone {
			<-configured
		}
		j.abandon()
		return fail(err)
	}
	if err := <-moved; err != nil {
		return abort(err)
	}
	traceJoin("cgroup")
	if err := j.await(true); err != nil {
		return abort(err)
	}
	configDone = true
	if err := <-configured; err != nil {
		return abort(err)
	}
	p.joinPid = j.joinPid
	traceJoin("ready")
	p.killAt(ctx, timeout)
	return p, nil
}

// joinTrace, when set (benchmarks only), is called at each stage of
// startJoined: "started" (the script's process forked), "pid" (the
// script entered the jail and forked), "cgroup" (the child is in the
// jail's cgroup), "ready" (runJoin is about to execute the program).
var joinTrace func(stage string)

func traceJoin(stage string) {
	if joinTrace != nil {
		joinTrace(stage)
	}
}

func readJoinStatus(r *bufio.Reader, st *joinStatus) error {
	return readReport(r, st, "the join ended without a report")
}

// waitJoined is wait's part for a joined process: the script's last
// report, after any error runJoin reported.
func (p *Process) waitJoined(r *Result) {
	var st joinStatus
	for {
		var line joinStatus
		if readJoinStatus(p.status, &line) != nil {
			break
		}
		if line.Exited {
			st = line
			break
		}
	}
	if !st.Exited {
		r.ExitCode, r.Signal = 137, "SIGKILL"
		return
	}
	r.ExitCode = st.ExitCode
	if st.Signal != 0 {
		r.ExitCode = 128 + st.Signal
		r.Signal = unix.SignalName(syscall.Signal(st.Signal))
	}
	r.CPUTime = time.Duration(st.CPUMs) * time.Millisecond
	r.MemoryPeak = st.MaxRSS * 1024
}

// runJoin is the init program in join mode: inside the jail already (the
// script entered it), in its cgroup. It sets itself up as the jail's
// program must run (limits, a session of its own, no capabilities, the
// seccomp filter), reports {prepared}, and then waits for its program
// (joinCommand), which it becomes: a Joiner's waits there, holding
// nothing the jail's own programs do not hold.
func runJoin() int {
	status := os.NewFile(joinStatusFD, "status")
	report := func(st joinStatus) { _ = json.NewEncoder(status).Encode(st) }
	failed := func(err error) int {
		report(joinStatus{initStatus: initStatus{Error: err.Error()}})
		return 126
	}
	var setup joinSetup
	cf := os.NewFile(joinConfigFD, "config")
	dec := json.NewDecoder(cf)
	if err := dec.Decode(&setup); err != nil {
		return failed(fmt.Errorf("read config: %w", err))
	}
	if err := setRlimits(&initConfig{Limits: setup.Limits}); err != nil {
		return failed(err)
	}
	// A session of its own: its process group is what Kill ends, and a
	// terminal becomes its controlling terminal.
	if _, err := unix.Setsid(); err != nil {
		return failed(fmt.Errorf("setsid: %w", err))
	}
	if setup.Terminal {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			return failed(fmt.Errorf("controlling terminal: %w", err))
		}
	}
	// Nothing of the host's but 0-2 reaches the program.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return failed(fmt.Errorf("close_range: %w", err))
	}
	if err := dropPrivileges(); err != nil {
		return failed(err)
	}
	if err := loadSeccomp(); err != nil {
		return failed(err)
	}
	report(joinStatus{Prepared: true})
	var c joinCommand
	if err := dec.Decode(&c); err != nil {
		return failed(fmt.Errorf("read config: %w", err))
	}
	cf.Close()
	if err := unix.Chdir(c.Dir); err != nil {
		return failed(fmt.Errorf("chdir %s: %w", c.Dir, err))
	}
	// DATA and NPROC bind the program, not this Go code: set last, as a
	// new jail's init does for its program (programRlimits), since the
	// runtime dies when its heap needs to grow under a small DATA limit.
	extra := make([]rlimit, len(setup.Extra))
	for i, r := range setup.Extra {
		extra[i] = rlimit{r.Name, r.Res, r.Val}
	}
	if err := applyRlimits(extra); err != nil {
		return failed(err)
	}
	report(joinStatus{Ready: true})
	err := syscall.Exec(c.Path, c.Args, c.Env)
	report(joinStatus{initStatus: initStatus{Error: fmt.Sprintf("start %s: %v", c.Path, err)}})
	return 127
}

// Path is p (absolute, as the jail sees it) as the host reaches it, under
// the jail's root: for os.OpenRoot, which then never leaves that
// directory. Check Alive after opening it: the PID may have been recycled
// before.
func (t *JoinTarget) Path(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", t.pid, p)
}

// Alive reports whether the jail's PID 1 still runs.
func (t *JoinTarget) Alive() bool {
	return t.pidfd >= 0 && unix.PidfdSendSignal(t.pidfd, 0, nil, 0) == nil
}

// Limits are the jail's limits.
func (t *JoinTarget) Limits() Limits { return t.limits }

// killSession kills every process of the session sid (a joined program's:
// it called setsid, so sid is its host PID). The program is not reaped
// yet (the script waiting for it is killed by nobody in the jail), so
// the number is still its session's. Its process group goes first, then
// whatever /proc shows in the session (an interactive shell's jobs have
// groups of their own), a few times over for what was forking meanwhile.
func killSession(sid int) {
	_ = unix.Kill(-sid, unix.SIGKILL)
	for range 3 {
		found := false
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			// pid (comm) state ppid pgrp session ...: comm may hold
			// anything, so fields count from its closing parenthesis.
			i := bytes.LastIndexByte(b, ')')
			if i < 0 {
				continue
			}
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 3 && f[3] == strconv.Itoa(sid) && f[0] != "Z" {
				_ = unix.Kill(pid, unix.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
	}
}

// drain copies a joined program's output to w until stop, then discards
// it, until no process holds the pipe (the jail's end at the latest).
type drain struct {
	mu   sync.Mutex
	w    io.Writer
	done chan struct{} // closed at the pipe's end
}

func (d *drain) run(r *os.File) {
	defer close(d.done)
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			d.mu.Lock()
			if d.w != nil {
				_, _ = d.w.Write(buf[:n])
			}
			d.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

func (d *drain) stop() {
	d.mu.Lock()
	d.w = nil
	d.mu.Unlock()
}

func fileOrNil(f *os.File) io.Writer {
	if f == nil {
		return nil
	}
	return f
}
