//go:build linux

package kernel

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// python is Debian's interpreter; the one on PATH may be a shim.
const python = "/usr/bin/python3"

// hostProcess runs a program on the host, in its own process group. The
// kernel package's tests exercise the protocol; the jailed kernel is tested
// in internal/session.
type hostProcess struct{ cmd *exec.Cmd }

func (h *hostProcess) Signal(sig os.Signal) error { return h.cmd.Process.Signal(sig) }
func (h *hostProcess) Kill() error {
	return syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
}
func (h *hostProcess) Wait() error { return h.cmd.Wait() }

// hostLauncher runs script (kernel.py if empty) with the host's python.
func hostLauncher(t testing.TB, script []byte) Launcher {
	if script == nil {
		script = Source
	}
	path := filepath.Join(t.TempDir(), "kernel.py")
	if err := os.WriteFile(path, script, 0o644); err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, f Files) (Process, error) {
		cmd := exec.Command(python, path)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + os.TempDir(), "MPLBACKEND=module://sandloop_backend", "MPLCONFIGDIR=" + t.TempDir()}
		cmd.Stderr = os.Stderr
		cmd.ExtraFiles = f.List()
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = time.Second
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return &hostProcess{cmd}, nil
	}
}

func startHost(t testing.TB, script []byte, opts *Options) *Kernel {
	t.Helper()
	k, err := Start(context.Background(), hostLauncher(t, script), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
