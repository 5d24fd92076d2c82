// Package webui serves sandloop's browser interface: hand-written HTML, CSS
// and JavaScript modules embedded in the binary, with no build step. The
// one library, the terminal emulator xterm.js, is a copy from npm kept in
// assets/vendor (xterm/vendor.sh makes it: go generate ./internal/webui),
// served from the binary like the rest: the page loads nothing from
// elsewhere.
package webui

//go:generate sh xterm/vendor.sh

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed assets
var assets embed.FS

// csp forbids everything the page does not need: scripts and styles come
// only from the server (no inline script, so HTML that slips into the page
// cannot run), images also from data: and blob: URLs (plots arrive as
// base64), no plugins, no framing of the UI by other sites, and connections
// only back to the server (no request leaves for another host).
const csp = "default-src 'self'; img-src 'self' data: blob:; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// types are set explicitly so that the host's mime.types cannot change them
// (a module script served as text/plain does not run).
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".txt":  "text/plain; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
}

type file struct {
	body  []byte
	ctype string
	etag  string
}

// Handler serves the UI: the page at "/" and its assets under "/ui/".
// Mount it for "GET /{$}" and "GET /ui/"; it needs no token, since it holds
// no data (the page sends the token with each API call it makes).
func Handler() http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := types[path.Ext(p)]
		if !ok {
			ct = "application/octet-stream"
		}
		sum := sha256.Sum256(b)
		files["/ui/"+strings.TrimPrefix(p, "assets/")] = file{b, ct, `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		panic("webui: embedded assets: " + err.Error())
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if p == "/" {
			p = "/ui/index.html"
		}
		f, ok := files[p]
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Type", f.ctype)
		// Always revalidate: the assets change with the binary, and a 304
		// costs one round trip on loopback.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		if match := r.Header.Get("If-None-Match"); match != "" && etagMatch(match, f.etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		if r.Method == http.MethodHead {
			return
		}
		w.Write(f.body)
	})
}

func etagMatch(header, etag string) bool {
	for _, part := range strings.Split(header, ",") {
		part = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(part), "W/"))
		if part == etag || part == "*" {
			return true
		}
	}
	return false
}

// Mounts returns the patterns to mount the UI at, for server.Options.PublicMounts.
func Mounts() map[string]http.Handler {
	h := Handler()
	return map[string]http.Handler{"GET /{$}": h, "GET /ui/": h}
}
