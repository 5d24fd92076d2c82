package gateway

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// TestStreamBeforeBodyEnds: a host may start an execution's stream
// before the transport is done with the request's body. The gateway
// passes the first line on while the client is still sending, and the
// stream goes on after the body ends. Without full duplex the gateway's
// HTTP/1 server consumes, then closes, the body as the first answer
// headers go out: here that blocks until the body ends; with a
// Content-Length body, the transport's last read past the length fails
// and the connection to the host is closed, cutting the stream after its
// first line (golang/go#40747), as TestCell once saw under load.
func TestStreamBeforeBodyEnds(t *testing.T) {
	const epoch = "epoch-duplex"
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			server.WriteJSON(w, http.StatusOK, server.Health{Status: "ok", Epoch: epoch, MaxSessions: 1})
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.EnableFullDuplex(); err != nil {
			t.Error(err)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","text":"ready"}`+"\n")
		rc.Flush()
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("host: reading the body after the first line: %v", err)
		}
		io.WriteString(w, `{"type":"end","body":`+string(b)+"}\n")
	}))
	t.Cleanup(host.Close)
	pgs := pgtest.Start(t)
	pg, err := store.OpenPostgres(t.Context(), pgs.NewDatabase(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	name := host.Listener.Addr().String()
	if err := pg.PutPlacement(t.Context(), store.Placement{ID: "s1", Kind: store.KindSession, Owner: server.OwnerOf(tok1), Host: name, Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	gw, err := New(&Options{Discovery: Static{{Name: name, URL: host.URL}}, Cluster: pg, Secret: secret, Tokens: []string{tok1},
		HealthInterval: time.Hour, LostAfter: time.Hour})

	if err != nil {
		t.Fatal(err)
	}
	gw.Refresh(t.Context())
	front := httptest.NewServer(gw)
	t.Cleanup(front.Close)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	// Without full duplex nothing comes back until the body ends: end it
	// after a while so the test fails instead of hanging.
	var ended atomic.Bool
	stop := time.AfterFunc(5*time.Second, func() { ended.Store(true); pw.Close() })
	defer stop.Stop()
	req, _ := http.NewRequestWithContext(ctx, "POST", front.URL+"/v1/sessions/s1/execute", pr)
	req.Header.Set("Authorization", "Bearer "+tok1)
	go pw.Write([]byte(`{"code":`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, "ready") {
		t.Fatalf("first line: %q %v", line, err)
	}
	if !stop.Stop() || ended.Load() {
		t.Fatal("the first line came only once the request body had ended")
	}
	pw.Write([]byte(`"1"}`))
	pw.Close()
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), `{"type":"end","body":{"code":"1"}}`) {
		t.Errorf("rest of the stream: %q %v", rest, err)
	}
}
