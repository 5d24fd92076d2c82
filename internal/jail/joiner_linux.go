package jail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// A Joiner is a join of a running jail made ahead of its command
// (PrepareJoin), so that a command costs little more than the exec of its
// program: the join program (or the join script) has started, entered the
// jail's cgroup and namespaces and forked, and its child (the program's,
// or runJoin, the init program in join mode) has set itself up as the
// jail's program must run (its rlimits, a session of its own, every
// capability dropped, securebits locked, not dumpable, the seccomp filter
// loaded) and reported {prepared}; it waits for its program on the
// configuration pipe. Start sends it the program; the child changes
// directory, sets the program's last rlimits and executes it.
//
// While it waits, it holds nothing the jail's programs do not: it runs as
// the sandbox's user, without capabilities, under the jail's filter (and
// a process of the jail cannot ptrace it or read its /proc entries: it is
// not dumpable). It is two processes of the jail's cgroup (the host-side
// one and the waiting child), counted against its Pids and charged its
// memory: ~100 KiB of their own with the join program (measured:
// BenchmarkJoinStages), as a running command's are; with the script, 6
// tasks (the init's Go runtime threads) and ~4 MiB. Its start's CPU (~2
// ms; the script's and init's ~25) is charged to the jail's group, whose
// limit is a quota per period, not a budget, so it changes nothing. It
// dies with the jail: its child is in the jail's PID namespace and
// cgroup, killed with them.
//
// A Joiner serves one command, without a terminal (its standard
// descriptors are pipes made ahead). Close it when it is not used.
type Joiner struct {
	pid     int // the target's PID 1, on the host
	enforce string
	warn    []string
	stdinW  *os.File

	mu      sync.Mutex
	j       *joining      // nil once started or closed
	claimed chan struct{} // closed when j is taken
}

// ErrJoinerUsed is returned by Joiner.Start of a Joiner already started
// or closed.
var ErrJoinerUsed = errors.New("jail: the prepared join was used or closed")

// PrepareJoin makes a Joiner of t's jail, and returns once its init waits
// for a program (or ctx ended: then it is killed). The Joiner needs
// nothing more of t, which the caller may close.
func PrepareJoin(ctx context.Context, t *JoinTarget) (*Joiner, error) {
	if t.pidfd < 0 {
		return nil, &ArgumentError{"join", errors.New("the target is closed")}
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer stdinR.Close()
	var outs []*drain
	var outW [2]*os.File
	defer func() {
		for _, f := range outW {
			if f != nil {
				f.Close() // the script's copies are the writers
			}
		}
	}()
	for i := range outW {
		wf, d, err := outPipe(nil) // its writer comes with the command
		if err != nil {
			stdinW.Close()
			for _, d := range outs {
				d.stop()
			}
			return nil, err
		}
		outW[i] = wf
		outs = append(outs, d)
	}
	j, err := spawnJoin(t, stdinR, outW[0], outW[1])
	if err != nil {
		stdinW.Close()
		return nil, err
	}
	j.outs = outs
	// An end of ctx closes the configuration (the script, or runJoin,
	// reads its end and exits: see abandon) and ends await.
	stop := context.AfterFunc(ctx, func() {
		j.cfgW.Close()
		_ = j.stR.SetReadDeadline(time.Now())
	})
	setup, warn := t.setup(false)
	err = j.enter(setup)
	if err == nil {
		err = j.await(false)
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		stdinW.Close()
		j.abandon()
		return nil, fmt.Errorf("prepare a join: %w", err)
	}
	w := &Joiner{pid: t.pid, enforce: t.enforce, warn: warn, stdinW: stdinW, j: j, claimed: make(chan struct{})}
	watchJoiner(w, j)
	return w, nil
}

// watchJoiner starts w's watch (a variable: a test runs it when it
// chooses, as the scheduler may under load).
var watchJoiner = func(w *Joiner, j *joining) { go w.watch(j) }

// watch reaps a Joiner whose jail ends before it is used: its output's
// pipe ends when the script and its child are gone. Only if it is still
// unused: once Start took it, its output's end is the program's (both
// cases may be ready by the time this runs, and select takes either),
// and the Process that Start made waits for it. (Released there, its
// status pipe was closed under that wait, and a command that ended well
// was reported killed: 137, SIGKILL, its output complete.)
func (w *Joiner) watch(j *joining) {
	select {
	case <-j.outs[0].done:
		w.release(w.take())
	case <-w.claimed:
	}
}

// take takes the join, if not taken already.
func (w *Joiner) take() *joining {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := w.j
	if j != nil {
		w.j = nil
		close(w.claimed)
	}
	return j
}

// release kills and reaps an unused join.
func (w *Joiner) release(j *joining) {
	if j != nil {
		w.stdinW.Close()
		j.abandon()
	}
}

// Pid is the host PID of the process that becomes the program: its init,
// waiting (0 once started or closed).
func (w *Joiner) Pid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.j == nil {
		return 0
	}
	return w.j.joinPid
}

// ScriptPid is the host PID of the join script, on the host's side of the
// jail, which waits for the program and reports how it ended.
func (w *Joiner) ScriptPid() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.j == nil {
		return 0
	}
	return w.j.cmd.Process.Pid
}

// Start starts cfg in the prepared join, as Start starts a Config whose
// Join is the Joiner's jail (cfg.Join may be nil, or that jail's). It
// fails with ErrJoinerUsed if the Joiner was used or closed, or with the
// join's error if the jail has ended meanwhile: the caller may then start
// cfg as usual.
func (w *Joiner) Start(ctx context.Context, cfg *Config) (*Process, error) {
	switch {
	case cfg.Path == "":
		return nil, &ArgumentError{"path", errors.New("empty")}
	case cfg.Terminal != nil:
		return nil, &ArgumentError{"terminal", errors.New("a prepared join has pipes, not a terminal: start the command with Config.Join")}
	case cfg.Join != nil && cfg.Join.pid != w.pid:
		return nil, &ArgumentError{"join", errors.New("the prepared join is of another jail")}
	}
	if err := checkCommand(cfg); err != nil {
		return nil, err
	}
	j := w.take()
	if j == nil {
		return nil, ErrJoinerUsed
	}
	p := &Process{done: make(chan struct{}), enforce: w.enforce, network: NetworkNone, warn: w.warn}
	j.process(p)
	j.outs[0].setWriter(cfg.Stdout)
	j.outs[1].setWriter(cfg.Stderr)
	if cfg.Stdin != nil {
		p.stdin = w.stdinW
		go func() {
			_, _ = io.Copy(w.stdinW, cfg.Stdin)
			w.stdinW.Close() // EOF for the program (a second Close is harmless)
		}()
	} else {
		w.stdinW.Close()
	}
	traceJoin("started")
	err := j.send(joinCommandOf(cfg))
	if err == nil {
		err = j.await(true)
	}
	if err != nil {
		p.closeStdin()
		j.abandon()
		return nil, err
	}
	traceJoin("ready")
	p.start = time.Now()
	p.killAt(ctx, cfg.Limits.Timeout)
	return p, nil
}

// Close kills the Joiner if it was not started, and waits for its
// processes to end.
func (w *Joiner) Close() error {
	w.release(w.take())
	return nil
}

func (d *drain) setWriter(w io.Writer) {
	d.mu.Lock()
	d.w = w
	d.mu.Unlock()
}
