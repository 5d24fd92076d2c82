package client_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/server"
)

// UpdateNetwork changes what a running session may reach: a loopback
// server on this machine (reached from the sandbox at the host's name) is
// refused, reached after an update, refused after the next.
func TestUpdateNetwork(t *testing.T) {
	t.Parallel()
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from the host") }))
	t.Cleanup(site.Close)
	port := site.Listener.Addr().(*net.TCPAddr).Port
	max, err := egress.ParseAllowlist([]string{"127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, newServer(t, &host.Config{PoolSize: 0, Egress: server.EgressOptions{Max: max}}), nil)
	ctx := context.Background()
	s := newSession(t, c, &client.CreateOptions{NetworkMode: "allow", Allow: []string{}})
	if s.NetworkMode != "allow" || len(s.Allow) != 0 {
		t.Fatalf("created: %+v", s)
	}
	fetch := func() string {
		t.Helper()
		r, err := c.Execute(ctx, s.ID, fmt.Sprintf(`
import urllib.request
try:
    print(urllib.request.urlopen("http://%s:%d/", timeout=20).read().decode())
except Exception as e:
    print(e)`, egress.HostName, port), nil)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(r.Stdout)
	}
	target := fmt.Sprintf("127.0.0.1:%d", port)
	if got := fetch(); !strings.Contains(got, "403: sandloop: egress to") || !strings.Contains(got, "allowed: nothing") {
		t.Fatalf("before the update: %q", got)
	}
	got, err := c.UpdateNetwork(ctx, s.ID, []string{target})
	if err != nil || strings.Join(got.Allow, ",") != target {
		t.Fatalf("UpdateNetwork: %+v %v", got, err)
	}
	if got := fetch(); got != "hello from the host" {
		t.Fatalf("after the update: %q", got)
	}
	if _, err := c.UpdateNetwork(ctx, s.ID, nil); err != nil {
		t.Fatal(err)
	}
	if got := fetch(); !strings.Contains(got, "allowed: nothing") {
		t.Fatalf("after the second update: %q", got)
	}
	if now, err := c.GetSession(ctx, s.ID); err != nil || len(now.Allow) != 0 || now.NetworkMode != "allow" {
		t.Errorf("GetSession: %+v %v", now, err)
	}
	_, err = c.UpdateNetwork(ctx, s.ID, []string{"10.0.0.0/8"})
	if ae := apiError(t, err); ae.StatusCode != 403 || ae.Code != "network_not_allowed" {
		t.Errorf("beyond --allow-max: %v", err)
	}
	plain := newSession(t, c, &client.CreateOptions{NetworkMode: "none"})
	_, err = c.UpdateNetwork(ctx, plain.ID, []string{target})
	if ae := apiError(t, err); ae.StatusCode != 409 || ae.Code != "no_allowlist" || !strings.Contains(ae.Message, `"allow": []`) {
		t.Errorf("a none session: %v", err)
	}
}
