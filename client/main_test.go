package client_test

import (
	"fmt"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
)

// serverURL is the address of a real sandloop server (real jails and
// kernels) started by TestMain, used by the examples.
var serverURL string

func TestMain(m *testing.M) {
	jail.MaybeInit() // the jail re-executes this binary as its init
	os.Exit(run(m))
}

func run(m *testing.M) int {
	mgr := session.NewManager(session.ManagerOptions{PoolSize: 2, MaxSessions: 32})
	srv, err := server.New(server.Options{Manager: mgr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	hs := httptest.NewServer(srv)
	serverURL = hs.URL
	code := m.Run()
	hs.Close()
	if err := mgr.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "manager close:", err)
		return 1
	}
	return code
}

// newServer starts a server of its own for one test, with the given
// options, and returns its URL.
func newServer(t testing.TB, mo session.ManagerOptions, so server.Options) string {
	t.Helper()
	mgr := session.NewManager(mo)
	so.Manager = mgr
	srv, err := server.New(so)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.Close()
		if err := mgr.Close(); err != nil {
			t.Errorf("manager close: %v", err)
		}
	})
	return hs.URL
}
