package client_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/jail"
)

// serverURL is the address of a real sandloop server (real jails and
// kernels) started by TestMain, used by the examples.
var serverURL string

func TestMain(m *testing.M) {
	jail.MaybeInit() // the jail re-executes this binary as its init
	os.Exit(run(m))
}

func run(m *testing.M) int {
	h, err := startHost(&host.Config{PoolSize: 2, MaxSessions: 32})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	serverURL = h.URL()
	code := m.Run()
	if err := h.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "host close:", err)
		return 1
	}
	return code
}

// startHost starts the real host (internal/host, as sandloop serve runs
// it) on a loopback port.
func startHost(cfg *host.Config) (*host.Host, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h, err := host.New(context.Background(), ln, cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	go h.Serve(context.Background()) // until Close
	return h, nil
}

// newServer starts a host of its own for one test, with cfg, and returns
// its URL.
func newServer(t testing.TB, cfg *host.Config) string {
	t.Helper()
	h, err := startHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("host close: %v", err)
		}
	})
	return h.URL()
}
