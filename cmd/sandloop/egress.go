package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/server"
)

// runJail runs cfg in a jail. With a policy, the jail gets the egress
// proxy's listener and variables, served by a gate until the jail ends,
// and the gate's log is returned.
func runJail(ctx context.Context, cfg *jail.Config, pol *egress.Policy) (*jail.Result, *egress.Log, error) {
	if pol == nil {
		res, err := jail.Run(ctx, cfg)
		return res, nil, err
	}
	c := *cfg
	c.ListenPort = egress.Port
	c.Env = append(egress.Env(egress.Port), cfg.Env...)
	p, err := jail.Start(ctx, &c)
	if err != nil {
		return nil, nil, err
	}
	g := egress.New(&egress.Options{Policy: *pol})
	g.Serve(p.Listener())
	res, err := p.Wait()
	g.Close()
	l := g.Log()
	return res, &l, err
}

// printNetworkLog writes a gate's log, one connection a line.
func printNetworkLog(w io.Writer, l *egress.Log) {
	if l == nil {
		return
	}
	fmt.Fprintf(w, "sandloop: network: %d connections, %d bytes through the proxy (allowed: %s)\n", len(l.Entries), l.Bytes, strings.Join(l.Allow, ", "))
	for _, e := range l.Entries {
		verdict := "allowed"
		switch {
		case !e.Allowed:
			verdict = "refused"
		case e.Open:
			verdict = "open (so far)"
		}
		line := fmt.Sprintf("sandloop: network: %s %s %s %s:%d, %d bytes out, %d in", e.Time.Format("15:04:05"), verdict, e.Method, e.Host, e.Port, e.BytesOut, e.BytesIn)
		if e.Reason != "" {
			line += " (" + e.Reason + ")"
		}
		fmt.Fprintln(w, line)
	}
}

// wheelCacheDir is where serve keeps the package cache: dir, or under the
// data directory; "" for none.
func wheelCacheDir(dir, dataDir string) string {
	switch dir {
	case "off":
		return ""
	case "":
		return filepath.Join(dataDir, "wheel-cache")
	}
	return dir
}

// openWheelCache opens serve's package cache (nil with --wheel-cache off).
func openWheelCache(dir, dataDir string, size int64, index string, log *slog.Logger) (*egress.Cache, error) {
	dir = wheelCacheDir(dir, dataDir)
	if dir == "" {
		return nil, nil
	}
	if size <= 0 {
		return nil, usagef("--wheel-cache-size must be positive (or --wheel-cache off)")
	}
	c, err := egress.OpenCache(&egress.CacheOptions{Dir: dir, MaxBytes: size, Index: index, Logger: log})
	if err != nil {
		return nil, usagef("--wheel-cache/--pip-index: %v", err)
	}
	return c, nil
}

// doctorWheelCache describes serve's package cache at its default place.
func doctorWheelCache() jail.Check {
	dir := wheelCacheDir("", defaultDataDir())
	fi, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		return jail.Check{OK: true, Detail: fmt.Sprintf("%s: not made yet (serve makes it; --wheel-cache, --wheel-cache-size %d MiB, --pip-index %s)", dir, egress.DefaultCacheBytes>>20, egress.DefaultIndex())}
	case err != nil:
		return jail.Check{Detail: err.Error()}
	case !fi.IsDir():
		return jail.Check{Detail: dir + " is not a directory", Fix: "remove it or give serve --wheel-cache DIR"}
	case fi.Mode().Perm()&0o077 != 0:
		return jail.Check{Detail: fmt.Sprintf("%s is open to other users (mode %o): only sandloop may write the files sessions install", dir, fi.Mode().Perm()), Fix: "chmod 700 " + dir}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "files", "??", "*"))
	var size int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			size += fi.Size()
		}
	}
	return jail.Check{OK: true, Detail: fmt.Sprintf("%s: %d package files, %.1f MiB (serve's cap: --wheel-cache-size, default %d MiB); allow-mode sessions whose allowlist covers the index install through it", dir, len(files), float64(size)/(1<<20), egress.DefaultCacheBytes>>20)}
}

// egressOptions reads serve's network flags.
func egressOptions(defaultMode string, allow, allowMax []string) (server.EgressOptions, error) {
	var o server.EgressOptions
	mode, err := egress.ParseMode(defaultMode)
	if err != nil || mode == egress.ModeHost {
		return o, usagef("--default-network must be none or allow")
	}
	o.DefaultMode = mode
	if len(allowMax) > 0 {
		if o.Max, err = egress.ParseAllowlist(allowMax); err != nil {
			return o, usagef("--allow-max: %v", err)
		}
	}
	if len(allow) > 0 {
		al, err := egress.ParseAllowlist(allow)
		if err != nil {
			return o, usagef("--allow: %v", err)
		}
		if err := al.Within(o.Max); err != nil {
			return o, usagef("--allow: %v", err)
		}
		o.Default = allow
	}
	if mode == egress.ModeAllow && len(allow) == 0 {
		return o, usagef("--default-network allow needs --allow: the hosts sessions may reach")
	}
	return o, nil
}

// doctorEgress checks allow mode end to end: a sandbox asks a server on
// this host's loopback (listed by address, as loopback is refused
// otherwise) for a page through the egress proxy, and for an address not
// listed, which must be refused.
func doctorEgress(ctx context.Context) jail.Check {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return jail.Check{Detail: err.Error()}
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "sandloop-doctor-pong") }),
		ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	al, err := egress.ParseAllowlist([]string{ln.Addr().String()})
	if err != nil {
		return jail.Check{Detail: err.Error()}
	}
	ws, err := os.MkdirTemp("", "sandloop-doctor-egress-")
	if err != nil {
		return jail.Check{Detail: err.Error()}
	}
	defer os.RemoveAll(ws)
	code := `
import http.client, os, time
def get(url):
    c = http.client.HTTPConnection(os.environ["HTTP_PROXY"][len("http://"):], timeout=20)
    c.request("GET", url)
    r = c.getresponse()
    return r.status, r.read().decode().strip()
t = time.perf_counter()
ok = get("http://` + ln.Addr().String() + `/")
ms = (time.perf_counter() - t) * 1000
print(ok[0], ok[1], get("http://192.0.2.7/")[0], "%.1f" % ms)
`
	var out, errb bytes.Buffer
	res, _, err := runJail(ctx, &jail.Config{Path: jail.DefaultPython, Args: []string{"python3", "-c", code}, Workspace: ws,
		Limits: jail.Limits{Timeout: 30 * time.Second}, Stdout: &out, Stderr: &errb}, &egress.Policy{Allow: al})
	if err != nil {
		return jail.Check{Detail: "cannot start a sandbox with the proxy: " + err.Error()}
	}
	f := strings.Fields(out.String())
	if res.ExitCode != 0 || len(f) != 4 || f[0] != "200" || f[1] != "sandloop-doctor-pong" || f[2] != "403" {
		return jail.Check{Detail: fmt.Sprintf("the round trip through the proxy failed: %q %s", strings.TrimSpace(out.String()), bytes.TrimSpace(errb.Bytes()))}
	}
	return jail.Check{OK: true, Detail: fmt.Sprintf("allow mode: a round trip from a sandbox through the proxy to a local server took %s ms; an address not listed was refused", f[3])}
}
