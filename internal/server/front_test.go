package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestFront: the checks serve and the gateway make before routing, each
// refusal in the API's JSON error shape.
func TestFront(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/sessions", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/v1/sessions/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {})
	browser := &Front{Mux: mux, AllowedHosts: []string{"sandloop.example"}}
	cellHost := &Front{Mux: mux, NoBrowserChecks: true}
	for _, tc := range []struct {
		name  string
		front *Front
		req   func() *http.Request
		code  string // "" when admitted
	}{
		{"loopback", browser, get("127.0.0.1:8080", "/v1/sessions"), ""},
		{"localhost", browser, get("localhost:1234", "/v1/sessions"), ""},
		{"IPv6 loopback", browser, get("[::1]:8080", "/v1/sessions"), ""},
		{"an allowed name", browser, get("SANDLOOP.example:443", "/v1/sessions"), ""},
		{"DNS rebinding", browser, get("evil.example", "/v1/sessions"), "bad_host"},
		{"cross-site fetch", browser, with(get("localhost", "/v1/sessions"), "Sec-Fetch-Site", "cross-site"), "cross_origin"},
		{"another origin's POST", browser, with(post("localhost", "/v1/sessions"), "Origin", "http://evil.example"), "cross_origin"},
		{"the same origin's POST", browser, with(post("localhost:8080", "/v1/sessions"), "Origin", "http://localhost:8080"), ""},
		{"scripted with a token", browser, with(with(post("localhost", "/v1/sessions"), "Origin", "http://evil.example"), "Authorization", "Bearer x"), ""},
		{"an opaque origin's GET", browser, with(get("localhost", "/v1/sessions"), "Origin", "null"), ""},
		{"dot-dot", browser, get("localhost", "/v1/sessions/x/files/../../etc/passwd"), "bad_path"},
		{"unknown route", browser, get("localhost", "/v2/nothing"), "not_found"},
		{"a cell's host: any name", cellHost, get("10.0.0.5:8080", "/v1/sessions"), ""},
		{"a cell's host: still no dot-dot", cellHost, get("10.0.0.5:8080", "/v1/sessions/x/files/./a"), "bad_path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			ok := tc.front.Admit(rec, tc.req())
			if tc.code == "" {
				if !ok || rec.Code != 200 || rec.Body.Len() != 0 {
					t.Fatalf("refused: %d %s", rec.Code, rec.Body)
				}
				return
			}
			var e struct {
				Error struct{ Code string }
			}
			if ok || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Code != tc.code {
				t.Fatalf("admitted %v: %d %s, want %s", ok, rec.Code, rec.Body, tc.code)
			}
		})
	}
}

func get(host, path string) func() *http.Request {
	return func() *http.Request {
		r := httptest.NewRequest("GET", "http://x"+path, nil)
		r.Host = host
		// httptest.NewRequest cleans nothing: keep the raw path.
		r.URL.Path = path
		return r
	}
}

func post(host, path string) func() *http.Request {
	return func() *http.Request { r := get(host, path)(); r.Method = "POST"; return r }
}

func with(f func() *http.Request, k, v string) func() *http.Request {
	return func() *http.Request { r := f(); r.Header.Set(k, v); return r }
}

func TestTokensOwner(t *testing.T) {
	ts := NewTokens([]string{"", "alpha-token", "beta-token"})
	if len(ts) != 2 {
		t.Fatalf("%d tokens, want the 2 non-empty ones", len(ts))
	}
	for _, tc := range []struct {
		header, query string
		path          string // if empty, the run event stream (which takes ?token=)
		owner         string
		ok            bool
	}{
		{"Bearer alpha-token", "", "", OwnerOf("alpha-token"), true},
		{"", "beta-token", "", OwnerOf("beta-token"), true},
		{"", "beta-token", "/v1/sessions/x/files/a.csv", OwnerOf("beta-token"), true},
		{"", "beta-token", "/v1/sessions", "", false}, // ?token= only where documented
		{"", "beta-token", "/v1/runs/x", "", false},
		{"Bearer wrong", "alpha-token", "", "", false}, // a header, even wrong, wins over ?token=
		{"alpha-token", "", "", "", false},             // not a bearer header
		{"", "", "", "", false},
	} {
		path := tc.path
		if path == "" {
			path = "/v1/runs/x/events"
		}
		r := httptest.NewRequest("GET", path+"?token="+tc.query, nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		rec := httptest.NewRecorder()
		owner, ok := ts.Owner(rec, r)
		if owner != tc.owner || ok != tc.ok || (!ok && rec.Code != http.StatusUnauthorized) {
			t.Errorf("%q %s?token=%q: %q %v (%d), want %q %v", tc.header, path, tc.query, owner, ok, rec.Code, tc.owner, tc.ok)
		}
	}
	if owner, ok := NewTokens(nil).Owner(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)); !ok || owner != "" {
		t.Errorf("no tokens: %q %v, want everyone admitted as \"\"", owner, ok)
	}
}
