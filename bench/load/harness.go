package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/host"
)

// harness is a real host started in this process for one measured run,
// with what the leak checks need: a private TMPDIR for its workspaces,
// what existed before, and a sampler of the cgroups its jails use.
type harness struct {
	h       *host.Host
	c       *client.Client
	tr      *http.Transport
	tmp     string
	before  snapshot
	mounts  int // lines of /proc/self/mountinfo naming sandloop before the run
	sampler *sampler
	restore func()
	log     io.Writer
}

// startHarness starts a host with cfg, as sandloop serve runs it, and a
// client for it allowing conns connections at once.
func startHarness(ctx context.Context, cfg *host.Config, conns int, log io.Writer) (*harness, error) {
	if err := becomeSubreaper(); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "sandloop-load-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	oldTmp, hadTmp := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", tmp)
	x := &harness{tmp: tmp, log: log, before: takeSnapshot(), mounts: sandloopMounts(tmp),
		restore: func() {
			if hadTmp {
				os.Setenv("TMPDIR", oldTmp)
			} else {
				os.Unsetenv("TMPDIR")
			}
			os.RemoveAll(tmp)
		}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		x.restore()
		return nil, err
	}
	x.h, err = host.New(ctx, ln, cfg)
	if err != nil {
		ln.Close()
		x.restore()
		return nil, err
	}
	go x.h.Serve(context.WithoutCancel(ctx)) // until Close
	x.tr = http.DefaultTransport.(*http.Transport).Clone()
	x.tr.MaxIdleConnsPerHost = conns
	x.c, err = client.New(x.h.URL(), &client.Options{HTTPClient: &http.Client{Transport: x.tr}})
	if err != nil {
		x.h.Close()
		x.restore()
		return nil, err
	}
	x.sampler = startSampler()
	return x, nil
}

func (x *harness) logf(format string, args ...any) {
	if x.log != nil {
		fmt.Fprintf(x.log, format+"\n", args...)
	}
}

// waitPool waits until the host's warm pool holds n kernels.
func (x *harness) waitPool(ctx context.Context, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := x.c.Health(ctx)
		if err != nil {
			return err
		}
		if h.PoolReady >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool holds %d kernels after 2 minutes, want %d", h.PoolReady, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finish checks the host holds no session, shuts it down and looks for
// anything left behind; problems found on the way are returned with the
// leaks.
func (x *harness) finish(ctx context.Context) (Leaks, []string) {
	defer x.restore()
	var problems []string
	// A create its client gave up on may still be starting: the server
	// deletes it when it is up.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		h, err := x.c.Health(hctx)
		cancel()
		if err != nil {
			problems = append(problems, fmt.Sprintf("healthz after the run: %v", err))
			break
		}
		if h.Sessions == 0 {
			break
		}
		if time.Now().After(deadline) {
			problems = append(problems, fmt.Sprintf("the server still holds %d sessions 30 s after every one was deleted", h.Sessions))
			break
		}
	}
	x.tr.CloseIdleConnections()
	if err := x.h.Close(); err != nil {
		problems = append(problems, fmt.Sprintf("host close: %v", err))
	}
	x.sampler.stop()
	l := findLeaks(x.before, x.sampler.names(), x.tmp, 10*time.Second)
	if n := sandloopMounts(x.tmp) - x.mounts; n > 0 {
		problems = append(problems, fmt.Sprintf("%d mounts under the run's TMPDIR remain in this process's mount table", n))
	}
	return l, problems
}

// sandloopMounts counts the mounts of this process's namespace under the
// run's TMPDIR, where the workspaces are (a sandbox's mounts live in its
// own namespace: one seen here is a leak into the host's).
func sandloopMounts(tmp string) int {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, tmp) {
			n++
		}
	}
	return n
}
