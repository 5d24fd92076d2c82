package webui

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	for p, h := range Mounts() {
		mux.Handle(p, h)
	}
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	for _, c := range []struct {
		path, ctype string
		status      int
		body        string
	}{
		{"/", "text/html; charset=utf-8", 200, `<script type="module" src="/ui/js/app.js">`},
		{"/ui/index.html", "text/html; charset=utf-8", 200, "<!doctype html>"},
		{"/ui/app.css", "text/css; charset=utf-8", 200, ".topbar"},
		{"/ui/js/app.js", "text/javascript; charset=utf-8", 200, "import"},
		{"/ui/js/highlight.js", "text/javascript; charset=utf-8", 200, "export function highlight"},
		{"/ui/favicon.svg", "image/svg+xml", 200, "<svg"},
		{"/ui/nope.js", "", 404, ""},
		{"/ui/", "", 404, ""},
		{"/elsewhere", "", 404, ""}, // not mounted: the API's own 404
	} {
		resp, err := http.Get(ts.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s: %d, want %d", c.path, resp.StatusCode, c.status)
			continue
		}
		if c.status != 200 {
			continue
		}
		h := resp.Header
		if got := h.Get("Content-Type"); got != c.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", c.path, got, c.ctype)
		}
		if !strings.Contains(string(b), c.body) {
			t.Errorf("GET %s: body lacks %q", c.path, c.body)
		}
		csp := h.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "img-src 'self' data: blob:", "script-src 'self';", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: CSP %q lacks %q", c.path, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP allows unsafe sources: %q", c.path, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-cache" || h.Get("ETag") == "" {
			t.Errorf("GET %s: headers %v", c.path, h)
		}
		// Revalidation answers 304 without a body.
		req, _ := http.NewRequest("GET", ts.URL+c.path, nil)
		req.Header.Set("If-None-Match", h.Get("ETag"))
		resp2, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if resp2.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with If-None-Match: %d, want 304", c.path, resp2.StatusCode)
		}
	}
}

var (
	blockComment = regexp.MustCompile(`(?s)/\*.*?\*/`)
	xmlNamespace = regexp.MustCompile(`["']http://www\.w3\.org/[0-9]{4}/[a-z]+["']`)
)

// The page must not reach any other host, nor carry inline script (the CSP
// would block it anyway, so it would be a bug).
func TestAssetsSelfContained(t *testing.T) {
	t.Parallel()
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	inline := regexp.MustCompile(`(?i)<script(\s[^>]*)?>`)
	n := 0
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		if strings.HasSuffix(p, ".txt") {
			return nil // a license, not loaded by the page
		}
		b, _ := assets.ReadFile(p)
		// XML namespaces are names, never fetched.
		s := xmlNamespace.ReplaceAllString(string(b), "")
		if strings.HasPrefix(p, "assets/vendor/") {
			// Copies from npm name their origins in comments.
			s = blockComment.ReplaceAllString(s, "")
		}
		if m := external.FindString(s); m != "" {
			t.Errorf("%s refers to another host: %q", p, m)
		}
		for _, tag := range inline.FindAllString(s, -1) {
			if !strings.Contains(tag, "src=") {
				t.Errorf("%s has an inline script: %s", p, tag)
			}
		}
		if strings.Contains(s, " style=") || strings.Contains(s, "innerHTML") || strings.Contains(s, "insertAdjacentHTML") {
			t.Errorf("%s uses inline styles or innerHTML", p)
		}
		return nil
	})
	if err != nil || n < 8 {
		t.Fatalf("walked %d assets: %v", n, err)
	}
}
