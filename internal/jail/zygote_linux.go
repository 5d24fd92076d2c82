package jail

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
)

// What a zygote (a process started with Config.Zygote) needs to give each
// child it forks the same protections Start gives a program.

// SeccompFilter returns the jail's seccomp program as the bytes of a struct
// sock_filter array in native byte order, ready for
// seccomp(SECCOMP_SET_MODE_FILTER) in a zygote's child.
func SeccompFilter() ([]byte, error) {
	raw, err := assembleSeccomp()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		out = binary.NativeEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.NativeEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

// ProcMasks returns the /proc entries a jail hides (masked: files behind
// /dev/null, directories behind an empty read-only tmpfs) and those it
// makes read-only, for a child that mounts a /proc of its own.
func ProcMasks() (masked, readOnly []string) {
	return append([]string(nil), procMasked...), append([]string(nil), procReadOnly...)
}

// Environ returns a jail program's environment: the minimal base (PATH,
// HOME, USER, LANG, TMPDIR) overridden by env.
func Environ(env []string) []string { return buildEnv(env) }

// GroupsSupported says why NewGroup cannot work on this host (an error
// wrapping ErrUnsupported), or nil if it can.
func GroupsSupported() error {
	if h := detectCgroups(); h.mode == "" {
		return fmt.Errorf("%w: cgroups unavailable (%s)", ErrUnsupported, h.reason)
	}
	return nil
}

// Group is a cgroup with a jail's limits, for processes a zygote forks
// rather than Start.
type Group struct {
	cg     *cgroup
	frozen atomic.Bool // Freeze was called at least once (ThawForKill)
}

// NewGroup creates a group enforcing l's memory, pids and CPU limits (zero
// fields take the defaults). It fails with ErrUnsupported where no cgroup
// is usable.
func NewGroup(l Limits) (*Group, error) {
	l = l.WithDefaults()
	if err := l.validate(); err != nil {
		return nil, err
	}
	if err := GroupsSupported(); err != nil {
		return nil, err
	}
	cg, err := newCgroup(detectCgroups(), "sandloop-"+rand.Text(), l)
	if err != nil {
		return nil, err
	}
	return &Group{cg: cg}, nil
}

// SetLimits replaces the group's memory, pids and CPU limits with l's
// (zero fields take the defaults).
func (g *Group) SetLimits(l Limits) error {
	l = l.WithDefaults()
	if err := l.validate(); err != nil {
		return err
	}
	return g.cg.setLimits(l)
}

// Add moves a process (by host PID) into the group.
func (g *Group) Add(pid int) error { return g.cg.add(pid) }

// Kill sends SIGKILL to every process in the group.
func (g *Group) Kill() { g.cg.kill() }

// ThawForKill thaws the group if it was ever frozen, for a kill: a task
// frozen by the v1 freezer does not die of a SIGKILL until thawed. The
// caller has sent SIGKILL to what it knows of the group (see Kill).
func (g *Group) ThawForKill() {
	if g.frozen.Load() {
		g.cg.thawForKill()
	}
}

// OOMKilled says whether the out-of-memory killer fired in the group.
func (g *Group) OOMKilled() bool { return g.cg.oomKilled() }

// Stats returns the group's CPU time, peak memory and whether the OOM
// killer fired in it.
func (g *Group) Stats() (cpu time.Duration, peak int64, oom bool) { return g.cg.stats() }

// Usage is what the group uses now.
func (g *Group) Usage() (LiveUsage, error) { return g.cg.live(), nil }

// Remove kills what is left in the group and deletes it.
func (g *Group) Remove() error { return g.cg.remove() }
