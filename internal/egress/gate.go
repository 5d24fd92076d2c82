package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Gate.
type Options struct {
	// Policy is what the session may reach.
	Policy Policy
	// LookupIP resolves a name to its addresses. If nil, the host's
	// resolver. (Tests map their own names to a local server.)
	LookupIP func(ctx context.Context, host string) ([]netip.Addr, error)
	// MaxLog is how many connections the log keeps (the oldest are
	// dropped, and counted). If zero, 1000.
	MaxLog int
	// Cache, if set, is the host's package cache the gate serves pip
	// from (see MirrorPath and PipEnv), shared with other gates.
	Cache *Cache
	// Logger receives diagnostics. If nil, they are discarded.
	Logger *slog.Logger
}

// Gate is one session's proxy: it serves the listeners it is given (one
// per kernel the session starts) under one policy, one byte and
// connection budget and one log. Its methods are safe for concurrent use.
type Gate struct {
	opts Options
	// policy holds the caps and timeouts, fixed for the gate's life; its
	// Allow is nil: the allowlist in force is allow, which SetAllow
	// replaces while connections are served.
	policy Policy
	allow  atomic.Pointer[Allowlist]
	log    *slog.Logger
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	total     atomic.Int64 // bytes through the gate, both directions
	committed atomic.Int64 // total and the bytes reserved by tunnel steps under way (at most MaxBytes)
	active    atomic.Int32 // connections being served

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]bool
	conns     map[net.Conn]bool
	entries   []Entry
	// open: the allowed connections under way (one request at a time per
	// client connection), listed by Log until finish logs them.
	open    map[*countConn]openConn
	dropped int
	wg      sync.WaitGroup
	client  *http.Client // the mirror's, made on first use

	ctx    context.Context // cancelled by Close; lookups, dials and mirror fetches start from it
	cancel context.CancelFunc
}

// Entry is one connection (a CONNECT tunnel) or one plain HTTP request
// through the gate, or a refusal.
type Entry struct {
	Time       time.Time `json:"time"`
	Method     string    `json:"method"` // CONNECT, GET, POST, ...
	Host       string    `json:"host"`
	Port       int       `json:"port"`
	Addr       string    `json:"addr,omitempty"` // the address dialled
	Allowed    bool      `json:"allowed"`
	Reason     string    `json:"reason,omitempty"` // why it was refused or cut
	Status     int       `json:"status,omitempty"` // a plain request's response status
	BytesOut   int64     `json:"bytes_out"`        // sent by the sandbox
	BytesIn    int64     `json:"bytes_in"`         // received by the sandbox
	DurationMS float64   `json:"duration_ms"`
	// Cache is set for a request to the package cache (MirrorPath): "hit"
	// (served from the host's cache), "miss" (fetched, verified, stored)
	// or "index" (an index page, fetched and never cached).
	Cache string `json:"cache,omitempty"`
	// Open: the connection or request is under way; its bytes and
	// duration are those so far.
	Open bool `json:"open,omitempty"`
}

// Log is a snapshot of a gate's state and its connection log.
type Log struct {
	Allow    []string `json:"allow"`
	Bytes    int64    `json:"bytes"`
	MaxBytes int64    `json:"max_bytes"`
	Active   int      `json:"active"`
	MaxConns int      `json:"max_conns"`
	Entries  []Entry  `json:"entries"`
	Dropped  int      `json:"dropped,omitempty"`
}

// Sort orders the entries by the time they began.
func (l *Log) Sort() {
	slices.SortStableFunc(l.Entries, func(a, b Entry) int { return a.Time.Compare(b.Time) })
}

// New returns a gate enforcing opts.Policy.
func New(o *Options) *Gate {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	g := &Gate{opts: opts, policy: opts.Policy.withDefaults(), listeners: map[net.Listener]bool{}, conns: map[net.Conn]bool{}}
	g.allow.Store(g.policy.Allow)
	g.policy.Allow = nil
	g.ctx, g.cancel = context.WithCancel(context.Background())
	if g.opts.MaxLog == 0 {
		g.opts.MaxLog = 1000
	}
	g.log = opts.Logger
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.lookup = opts.LookupIP
	if g.lookup == nil {
		g.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	return g
}

// Serve accepts connections on ln in the background until ln or the gate
// is closed. The gate owns ln from now on.
func (g *Gate) Serve(ln net.Listener) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		ln.Close()
		return
	}
	g.listeners[ln] = true
	g.wg.Add(1)
	g.mu.Unlock()
	go func() {
		defer g.wg.Done()
		defer func() {
			g.mu.Lock()
			delete(g.listeners, ln)
			g.mu.Unlock()
			ln.Close()
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return
			}
			if !g.track(c) {
				c.Close()
				return
			}
			go func() {
				defer g.wg.Done()
				defer g.untrack(c)
				g.serveConn(c)
			}()
		}
	}()
}

// track registers a connection (and a goroutine for it) unless the gate is closed.
func (g *Gate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = true
	g.wg.Add(1)
	return true
}

func (g *Gate) untrack(c net.Conn) {
	c.Close()
	g.mu.Lock()
	delete(g.conns, c)
	g.mu.Unlock()
}

// Close stops every listener and connection and waits for them to end.
func (g *Gate) Close() error {
	g.mu.Lock()
	g.closed = true
	g.cancel()
	for ln := range g.listeners {
		ln.Close()
	}
	for c := range g.conns {
		c.Close()
	}
	client := g.client
	g.mu.Unlock()
	g.wg.Wait()
	if client != nil {
		client.CloseIdleConnections()
	}
	return nil
}

// openConn is an allowed connection under way: its entry as it began.
type openConn struct {
	e     Entry
	start time.Time
}

// opened lists the connection c, allowed under al and now connected, in
// the log (Open) until finish logs its entry. If SetAllow replaced al
// meanwhile, the target is judged again by the list in force (under the
// lock SetAllow sweeps under, so no connection slips between the two) and
// a refusal is returned if it no longer may be reached.
func (g *Gate) opened(e Entry, c *countConn, start time.Time, al *Allowlist) *refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := g.allow.Load(); now != al {
		if why := g.disallowed(now, e); why != "" {
			return &refusal{http.StatusForbidden, "sandloop: " + why}
		}
	}
	if g.open == nil {
		g.open = map[*countConn]openConn{}
	}
	e.Allowed = true
	g.open[c] = openConn{e, start}
	return nil
}

// Allowlist returns the allowlist in force.
func (g *Gate) Allowlist() *Allowlist { return g.allow.Load() }

// SetAllow replaces the allowlist in force (nil allows nothing). Every
// connection and request from now on is judged by al. Connections under
// way that al no longer allows (their name, or the address dialled, is
// not covered) are cut at once, each logged with why: taking a host off
// the list ends the session's access to it, as a user removing it
// expects. Those al still allows go on undisturbed.
func (g *Gate) SetAllow(al *Allowlist) {
	g.mu.Lock()
	g.allow.Store(al)
	var cut []*countConn
	for c, o := range g.open {
		if why := g.disallowed(al, o.e); why != "" {
			c.cut.Store(&why)
			cut = append(cut, c)
		}
	}
	client := g.client
	g.mu.Unlock()
	for _, c := range cut {
		c.Conn.Close() // the tunnel's or request's copy fails, and it ends
	}
	if client != nil {
		// The mirror's idle upstream connections were checked under the
		// old list.
		client.CloseIdleConnections()
	}
}

// disallowed says why al does not let the connection of entry e go on
// ("" if it does): its target as asked, then the address dialled.
func (g *Gate) disallowed(al *Allowlist, e Entry) string {
	target := net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	ad, err := netip.ParseAddr(e.Host)
	switch {
	case err == nil:
		if !al.allowsAddrTarget(ad.Unmap(), e.Port) {
			return "the session's allowlist no longer allows " + target
		}
	case e.Host == HostName || e.Host == "localhost":
		if !al.allowsAddrTarget(hostLoopback, e.Port) && !al.allowsAddrTarget(netip.IPv6Loopback(), e.Port) {
			return "the session's allowlist no longer allows " + target
		}
	default:
		if !al.allowsName(e.Host, e.Port) {
			return "the session's allowlist no longer allows " + target
		}
	}
	if ap, err := netip.ParseAddrPort(e.Addr); err == nil {
		if why := g.policy.forbidden(al, ap.Addr(), e.Port); why != "" {
			return fmt.Sprintf("%s is %s, which the session's allowlist no longer covers", ap.Addr().Unmap(), why)
		}
	}
	return ""
}

// Log returns the gate's counters and its connection log in the order the
// entries were made (a tunnel's when it ends; see Log.Sort), then the
// connections under way (Open, with their bytes so far).
func (g *Gate) Log() Log {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := Log{Allow: g.allow.Load().Entries(), Bytes: g.total.Load(), MaxBytes: g.policy.MaxBytes,
		Active: int(g.active.Load()), MaxConns: g.policy.MaxConns, Entries: append([]Entry(nil), g.entries...), Dropped: g.dropped}
	var open []Entry
	for c, o := range g.open {
		e := o.e
		e.Open = true
		e.BytesOut, e.BytesIn = c.out.Load(), c.in.Load()
		e.DurationMS = float64(time.Since(o.start).Microseconds()) / 1000
		open = append(open, e)
	}
	slices.SortStableFunc(open, func(a, b Entry) int { return a.Time.Compare(b.Time) })
	l.Entries = append(l.Entries, open...)
	if l.Allow == nil {
		l.Allow = []string{}
	}
	if l.Entries == nil {
		l.Entries = []Entry{}
	}
	return l
}

func (g *Gate) record(e Entry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recordLocked(e)
}

func (g *Gate) recordLocked(e Entry) {
	if len(g.entries) >= g.opts.MaxLog {
		n := len(g.entries) - g.opts.MaxLog + 1
		g.entries = append(g.entries[:0], g.entries[n:]...)
		g.dropped += n
	}
	g.entries = append(g.entries, e)
}

// finish completes a connection's or request's entry (bytes, duration, a
// cut by the cap) and logs it.
func (g *Gate) finish(e *Entry, c *countConn, start time.Time) {
	e.BytesOut, e.BytesIn = c.out.Load(), c.in.Load()
	e.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	if c.capError.Load() && e.Reason == "" {
		e.Reason = fmt.Sprintf("cut: the session's cap of %d bytes through the proxy was reached", g.policy.MaxBytes)
	}
	if why := c.cut.Load(); why != nil {
		e.Reason = "cut: " + *why
	}
	// (One step: a snapshot sees the connection under way or logged.)
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.open, c)
	g.recordLocked(*e)
}

// refusal is a refused or failed request: an HTTP status and words.
type refusal struct {
	status int
	msg    string
}

func (r *refusal) Error() string { return r.msg }

// writeRefusal answers a request the gate will not carry. The message is
// also the reason phrase: clients that report only the status line (pip's
// "Tunnel connection failed: 403 ...") still show it.
func writeRefusal(w io.Writer, r *refusal) {
	msg := strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f {
			return ' '
		}
		return c
	}, r.msg)
	body := msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Sandloop-Egress: refused\r\n\r\n%s",
		r.status, msg, len(body), body)
}

// countConn counts the sandbox side's bytes against the session's cap and
// into the current entry, and closes idle connections.
type countConn struct {
	net.Conn
	g        *Gate
	out, in  atomic.Int64 // of the current entry
	last     *atomic.Int64
	capError atomic.Bool
	cut      atomic.Pointer[string] // why SetAllow cut the connection
}

// take charges up to n bytes against the session's cap and returns how
// many fit: what is sent is never more than the cap.
func (g *Gate) take(n int64) int64 {
	for {
		cur := g.committed.Load()
		k := min(n, g.policy.MaxBytes-cur)
		if k <= 0 {
			return 0
		}
		if g.committed.CompareAndSwap(cur, cur+k) {
			g.total.Add(k)
			return k
		}
	}
}

// minStep is the smallest step a tunnel reserves while more is left.
const minStep = 16 << 10

// reserve sets aside up to want bytes of the cap for one step of a tunnel's
// copy, at most a quarter of what is left (so the other direction and
// other tunnels are not starved while it waits), and returns the grant;
// settle gives back what the step did not use.
func (g *Gate) reserve(want int64) int64 {
	for {
		cur := g.committed.Load()
		left := g.policy.MaxBytes - cur
		if left <= 0 {
			return 0
		}
		k := min(want, max(left/4, min(left, minStep)))
		if g.committed.CompareAndSwap(cur, cur+k) {
			return k
		}
	}
}

// refund gives back n bytes taken but not sent (a failed write).
func (g *Gate) refund(n int64) {
	if n > 0 {
		g.committed.Add(-n)
		g.total.Add(-n)
	}
}

func (g *Gate) settle(grant, used int64) {
	g.committed.Add(used - grant)
	g.total.Add(used)
}

func (c *countConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.last.Store(time.Now().UnixNano())
	k := int(c.g.take(int64(n)))
	c.out.Add(int64(k))
	if k < n { // the rest is dropped
		c.capError.Store(true)
		return k, errCap
	}
	return n, err
}

func (c *countConn) Write(p []byte) (int, error) {
	k := int(c.g.take(int64(len(p))))
	n, err := c.Conn.Write(p[:k])
	c.in.Add(int64(n))
	c.g.refund(int64(k - n))
	c.last.Store(time.Now().UnixNano())
	if err == nil && k < len(p) {
		c.capError.Store(true)
		err = errCap
	}
	return n, err
}

func (g *Gate) serveConn(raw net.Conn) {
	var last atomic.Int64
	c := &countConn{Conn: raw, g: g, last: &last}
	br := bufio.NewReaderSize(c, maxHead)
	for {
		// (Bytes already read ahead count for the request they belong to.)
		c.out.Store(int64(br.Buffered()))
		c.in.Store(0)
		c.SetReadDeadline(time.Now().Add(g.policy.IdleTimeout))
		head, err := peekHead(br)
		var req *http.Request
		if err == nil {
			req, err = http.ReadRequest(br)
		}
		if err != nil {
			switch {
			case c.capError.Load():
				// The cap was reached before the request could be read (no
				// answer can be sent either): still, every connection is
				// logged.
				g.finish(&Entry{Time: time.Now()}, c, time.Now())
			case !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isTimeout(err):
				writeRefusal(c, &refusal{http.StatusBadRequest, "sandloop: the proxy could not read the request: " + err.Error()})
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		if n := g.active.Add(1); int(n) > g.policy.MaxConns {
			g.active.Add(-1)
			host, port := splitTarget(req)
			r := &refusal{http.StatusServiceUnavailable, fmt.Sprintf("sandloop: too many connections through the proxy (at most %d at once)", g.policy.MaxConns)}
			g.record(Entry{Time: time.Now(), Method: req.Method, Host: host, Port: port, Reason: r.msg})
			writeRefusal(c, r)
			return
		}
		var again bool
		switch {
		case req.Method == http.MethodConnect:
			g.tunnel(c, br, req)
		case forMirror(req):
			again = g.serveMirror(c, req)
		default:
			again = g.forward(c, req, head)
		}
		g.active.Add(-1)
		if !again {
			return
		}
	}
}

// forMirror reports whether req asks for the package cache's mirror: by
// path (http://127.0.0.1:3128/... with the proxy bypassed), or through the
// proxy by an absolute URL naming a loopback host (pip's --proxy, which
// PIP_PROXY sets, ignores NO_PROXY).
func forMirror(req *http.Request) bool {
	if !strings.HasPrefix(req.URL.Path, MirrorPath) {
		return false
	}
	if req.URL.Host == "" {
		return true
	}
	h := req.URL.Hostname()
	ad, err := netip.ParseAddr(h)
	return req.URL.Scheme == "http" && (h == "localhost" || err == nil && ad.Unmap().IsLoopback())
}

// maxHead caps a request's line and headers.
const maxHead = 64 << 10

// head is what the raw header lines of a request say about its framing
// and target (net/http folds these away: it keeps one Host and drops
// Content-Length beside chunked).
type head struct {
	hosts         []string
	contentLength bool
	transferEnc   bool
}

// peekHead reads ahead until the request's headers have arrived (without
// consuming them) and reads their Host, Content-Length and
// Transfer-Encoding lines.
func peekHead(br *bufio.Reader) (head, error) {
	var h head
	if _, err := br.Peek(1); err != nil {
		return h, err
	}
	for {
		b, _ := br.Peek(br.Buffered())
		end := bytes.Index(b, []byte("\r\n\r\n"))
		if end < 0 {
			end = bytes.Index(b, []byte("\n\n"))
		}
		if end >= 0 {
			lines := strings.Split(string(b[:end]), "\n")
			for _, l := range lines[1:] {
				name, value, ok := strings.Cut(strings.TrimRight(l, "\r"), ":")
				if !ok {
					continue
				}
				switch strings.ToLower(strings.TrimSpace(name)) {
				case "host":
					h.hosts = append(h.hosts, strings.TrimSpace(value))
				case "content-length":
					h.contentLength = true
				case "transfer-encoding":
					h.transferEnc = true
				}
			}
			return h, nil
		}
		if br.Buffered() >= maxHead {
			return h, errors.New("the request's headers are too large")
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return h, err
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// splitTarget returns the host and port a request asks for (for the log).
func splitTarget(req *http.Request) (string, int) {
	hostport := req.Host
	if req.Method != http.MethodConnect && req.URL != nil && req.URL.Host != "" {
		hostport = req.URL.Host
	}
	host, portText, err := net.SplitHostPort(hostport)
	if err != nil {
		host, portText = hostport, "80"
	}
	port, _ := strconv.Atoi(portText)
	return strings.ToLower(strings.TrimSuffix(host, ".")), port
}

// check decides whether host:port may be reached under the allowlist in
// force and returns the addresses to dial and the allowlist it judged by
// (opened checks it is still the one in force).
func (g *Gate) check(ctx context.Context, host string, port int) ([]netip.Addr, *Allowlist, *refusal) {
	al := g.allow.Load()
	addrs, r := g.checkUnder(ctx, al, host, port)
	return addrs, al, r
}

func (g *Gate) checkUnder(ctx context.Context, al *Allowlist, host string, port int) ([]netip.Addr, *refusal) {
	allowed := al.Entries()
	list := strings.Join(allowed, ", ")
	if list == "" {
		list = "nothing"
	}
	notAllowed := func(what string) *refusal {
		return &refusal{http.StatusForbidden, fmt.Sprintf("sandloop: egress to %s is not allowed; allowed: %s", what, list)}
	}
	if port < 1 || port > 65535 {
		return nil, &refusal{http.StatusBadRequest, "sandloop: the request names no valid port"}
	}
	var addrs []netip.Addr
	if ad, err := netip.ParseAddr(host); err == nil {
		ad = ad.Unmap()
		if !al.allowsAddrTarget(ad, port) {
			return nil, notAllowed(net.JoinHostPort(ad.String(), strconv.Itoa(port)))
		}
		addrs = []netip.Addr{ad}
	} else if host == HostName || host == "localhost" {
		// The host's loopback (localhost asked of the proxy by a client that
		// ignores NO_PROXY means the same): only where an entry lists it.
		for _, ad := range []netip.Addr{hostLoopback, netip.IPv6Loopback()} {
			if al.allowsAddrTarget(ad, port) {
				addrs = append(addrs, ad)
			}
		}
		if len(addrs) == 0 {
			return nil, notAllowed(net.JoinHostPort(host, strconv.Itoa(port)) + " (the host's loopback)")
		}
	} else {
		if !validName(host) {
			return nil, &refusal{http.StatusBadRequest, fmt.Sprintf("sandloop: %q is not a host name", host)}
		}
		if !al.allowsName(host, port) {
			what := host
			if port != 80 && port != 443 {
				what = net.JoinHostPort(host, strconv.Itoa(port))
			}
			return nil, notAllowed(what)
		}
		rctx, cancel := context.WithTimeout(ctx, g.policy.DialTimeout)
		found, err := g.lookup(rctx, host)
		cancel()
		if err != nil || len(found) == 0 {
			return nil, &refusal{http.StatusBadGateway, fmt.Sprintf("sandloop: %s could not be resolved", host)}
		}
		addrs = found
	}
	var ok []netip.Addr
	var why string
	for _, ad := range addrs {
		if w := g.policy.forbidden(al, ad, port); w != "" {
			if why == "" {
				why = fmt.Sprintf("%s is %s", ad.Unmap(), w)
			}
			continue
		}
		ok = append(ok, ad.Unmap())
	}
	if len(ok) == 0 {
		return nil, &refusal{http.StatusForbidden, fmt.Sprintf("sandloop: egress to %s is refused: %s, which sandboxes may not reach", host, why)}
	}
	return ok, nil
}

// dial connects to the first reachable of addrs (already checked: never
// resolved again, so a name cannot change its answer between the check
// and the connection).
func (g *Gate) dial(ctx context.Context, addrs []netip.Addr, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: g.policy.DialTimeout}
	var firstErr error
	for _, ad := range addrs {
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(ad, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return nil, firstErr
}

func dialReason(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}

// Env is the environment that points a sandbox's clients (pip, requests,
// urllib, curl) at the proxy on its loopback at port, and lets pip install
// into the user's site (the workspace) although the system is read-only.
func Env(port int) []string {
	u := "http://127.0.0.1:" + strconv.Itoa(port)
	noProxy := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + u, "HTTPS_PROXY=" + u, "ALL_PROXY=" + u, "NO_PROXY=" + noProxy,
		"http_proxy=" + u, "https_proxy=" + u, "all_proxy=" + u, "no_proxy=" + noProxy,
		"PIP_PROXY=" + u,
		"PIP_BREAK_SYSTEM_PACKAGES=1", // the system is read-only: pip falls back to --user (the workspace)
		"PIP_DISABLE_PIP_VERSION_CHECK=1",
		"PIP_NO_INPUT=1",
		"PIP_DEFAULT_TIMEOUT=60",
	}
}
