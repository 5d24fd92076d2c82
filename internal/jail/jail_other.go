//go:build !linux

package jail

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"time"
)

// MaybeInit does nothing where jails are unsupported.
func MaybeInit() {}

// Process is a running jail (never, on this system).
type Process struct{}

// JoinTarget is a running jail (never, on this system).
type JoinTarget struct{}

func (*Process) JoinTarget() (*JoinTarget, error) { return nil, ErrUnsupported }
func (*JoinTarget) Close() error                  { return nil }
func (*JoinTarget) Path(p string) string          { return p }
func (*JoinTarget) Alive() bool                   { return false }
func (*JoinTarget) Limits() Limits                { return Limits{} }

// Joiner is a join made ahead (never, on this system).
type Joiner struct{}

// ErrJoinerUsed is returned by Joiner.Start of a Joiner used or closed.
var ErrJoinerUsed = errors.New("jail: the prepared join was used or closed")

// PrepareJoin fails: the jail needs Linux namespaces.
func PrepareJoin(context.Context, *JoinTarget) (*Joiner, error) { return nil, ErrUnsupported }

func (*Joiner) Start(context.Context, *Config) (*Process, error) { return nil, ErrUnsupported }
func (*Joiner) Close() error                                     { return nil }
func (*Joiner) Pid() int                                         { return 0 }
func (*Joiner) ScriptPid() int                                   { return 0 }

// Start fails: the jail needs Linux namespaces.
func Start(context.Context, *Config) (*Process, error) { return nil, ErrUnsupported }

// Run fails: the jail needs Linux namespaces.
func Run(context.Context, *Config) (*Result, error) { return nil, ErrUnsupported }

func (*Process) Pid() int                { return 0 }
func (*Process) Listener() net.Listener  { return nil }
func (*Process) Signal(os.Signal) error  { return ErrUnsupported }
func (*Process) Kill()                   {}
func (*Process) Wait() (*Result, error)  { return nil, ErrUnsupported }
func (*Process) Done() <-chan struct{}   { return nil }
func (*Process) Freeze() error           { return ErrUnsupported }
func (*Process) Thaw() error             { return ErrUnsupported }
func FreezeMethod() string               { return "" }
func FreezeSupport() Check               { return Check{Detail: "needs Linux"} }
func (*Process) Resize(WindowSize) error { return ErrUnsupported }
func (*Process) Usage() (LiveUsage, error) {
	return LiveUsage{}, ErrUnsupported
}
func Probe() HostReport             { return HostReport{} }
func ProbeConfinement() Confinement { return Confinement{} }
func SeccompSupported() bool        { return false }
func RunningInits() []int           { return nil }
func InitInfo() string              { return "" }
func JoinInfo() string              { return "" }

// NewQuotaDir makes an ordinary directory: quotas need Linux.
func NewQuotaDir(disk int64, files int) (*QuotaDir, error) {
	l := Limits{Disk: disk, Files: files}.WithDefaults()
	if err := l.validateQuota(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sandloop-ws-*")
	if err != nil {
		return nil, err
	}
	return &QuotaDir{Path: dir, Disk: l.Disk, Files: l.Files, Reason: "needs Linux"}, nil
}

func QuotaSupport() Check                 { return Check{Detail: "needs Linux"} }
func (q *QuotaDir) Usage() (Usage, error) { return walkUsage(q.Path) }
func (q *QuotaDir) Remove() error         { return removeDir(q.Path) }

func (*Process) DialLoopback(context.Context, int) (net.Conn, error) { return nil, ErrUnsupported }
func (*Process) ListeningPorts() ([]int, error)                      { return nil, ErrUnsupported }

// ErrPortsNeedRoot and ErrNoOwnNetwork: see the Linux build.
var (
	ErrPortsNeedRoot = errors.New("reaching a port inside a sandbox needs a server running as root")
	ErrNoOwnNetwork  = errors.New("the sandbox shares the host's network, so it has no ports of its own")
)

// NewQuotaDirFor fails: keepers need Linux.
func NewQuotaDirFor(int64, int, int) (*QuotaDir, error) { return nil, ErrUnsupported }

// AdoptQuotaDir is the directory at path.
func AdoptQuotaDir(path string, disk int64, files int, enforced bool) *QuotaDir {
	return &QuotaDir{Path: path, Disk: disk, Files: files, Enforced: enforced}
}

// SpawnFunc: see the Linux build.
type SpawnFunc func(cmd *exec.Cmd) (pid int, pidfd *os.File, err error)

// Handoff: see the Linux build.
type Handoff struct{ Pid int }

func (*Process) Handoff() (Handoff, []*os.File, error) { return Handoff{}, nil, ErrUnsupported }
func (*Process) Detach()                               {}
func Attach(Handoff, []*os.File) (*Process, error)     { return nil, ErrUnsupported }

// NewLastingQuotaDir is NewQuotaDir for pid 0 (this process); it fails for
// a keeper's: keepers need Linux.
func NewLastingQuotaDir(disk int64, files int, pid int) (*QuotaDir, error) {
	if pid != 0 {
		return nil, ErrUnsupported
	}
	return NewQuotaDir(disk, files)
}

// LeftoverGrace: see the Linux build.
const LeftoverGrace = 15 * time.Minute

// Leftover is false: no workspace outlives its owner here.
func Leftover(string, int) bool { return false }

// LeftWorkspaces is none: no workspace outlives its owner here.
func LeftWorkspaces() (int, int64) { return 0, 0 }

// RemoveLeftover fails: no workspace outlives its owner here.
func RemoveLeftover(string, int) error { return ErrUnsupported }

// SweepWorkspacesOf does nothing: keepers need Linux.
func SweepWorkspacesOf(int, map[string]bool) int { return 0 }

// OverlayUnsupported: overlay workspaces need Linux.
func OverlayUnsupported() string { return "needs Linux" }

// NewFrozenDir fails: overlay workspaces need Linux.
func NewFrozenDir(int64, int) (*QuotaDir, error) { return nil, ErrUnsupported }

func (q *QuotaDir) Freeze() error             { return ErrUnsupported }
func (q *QuotaDir) Overlay() bool             { return false }
func (q *QuotaDir) MountOverlay(string) error { return ErrUnsupported }

func (q *QuotaDir) OverlayUnwritten() (bool, error) { return false, ErrUnsupported }
