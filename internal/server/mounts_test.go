package server

import (
	"net/http"
	"testing"

	"github.com/sandloop/sandloop/internal/session"
)

func TestPublicMounts(t *testing.T) {
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("page")) })
	ts := newTestServer(t, session.ManagerOptions{}, Options{
		Tokens:       []string{tokenA},
		Mounts:       map[string]http.Handler{"GET /private": page},
		PublicMounts: map[string]http.Handler{"GET /{$}": page},
	})
	for _, c := range []struct {
		path, host string
		status     int
	}{
		{"/", "", 200},            // public: no token needed
		{"/private", "", 401},     // a private mount still needs the token
		{"/v1/sessions", "", 401}, // and so does the API
		{"/", "evil.example:80", 403},
	} {
		req, _ := http.NewRequest("GET", ts.URL+c.path, nil)
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s (Host %q): %d, want %d", c.path, c.host, resp.StatusCode, c.status)
		}
	}
}
