package host

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
)

func TestMain(m *testing.M) {
	jail.MaybeInit() // the jail re-executes this binary as its init
	os.Exit(m.Run())
}

func start(t *testing.T, cfg *Config) *Host {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(t.Context(), ln, cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// Sandboxes never reach the host through their egress proxy: its
// listener's address, and its port on any address, are denied in the
// policy every session starts from, before the first sandbox starts.
func TestSelfDeny(t *testing.T) {
	keep := netip.MustParseAddrPort("192.0.2.1:80")
	cfg := &Config{}
	cfg.Egress.Policy.Deny = []netip.AddrPort{keep}
	h := start(t, cfg)
	ap := netip.MustParseAddrPort(h.ln.Addr().String())
	deny := h.cfg.Egress.Policy.Deny
	for _, want := range []netip.AddrPort{keep, ap, netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port())} {
		if !slices.Contains(deny, want) {
			t.Errorf("Deny %v lacks %v", deny, want)
		}
	}
	if len(cfg.Egress.Policy.Deny) != 1 {
		t.Errorf("New changed the caller's Config: %v", cfg.Egress.Policy.Deny)
	}
}

// Serve answers until Close, which stops the listener; Close twice is fine.
func TestServeClose(t *testing.T) {
	h := start(t, nil)
	served := make(chan error, 1)
	go func() { served <- h.Serve(context.Background()) }()
	resp, err := http.Get(h.URL() + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := http.Get(h.URL() + "/healthz"); err == nil {
		t.Error("the host still answers after Close")
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
