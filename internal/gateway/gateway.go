// Package gateway is a cell's front door: the same HTTP API, MCP endpoint
// and web UI as `sandloop serve`, backed by many hosts. It places each new
// session on the better of two ready hosts by free slots, records where it
// lives (and under which epoch of that host) in PostgreSQL, and proxies
// every later request of it to that host, streams intact. Sessions of a
// host that restarted or was lost answer 410 Gone. Hosts are found by a
// Discovery: Kubernetes EndpointSlices, a static list, or the hosts' own
// heartbeats in PostgreSQL.
package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
)

// Cluster is the shared state a gateway uses (store.Postgres).
type Cluster interface {
	PutPlacement(ctx context.Context, p store.Placement) error
	GetPlacement(ctx context.Context, id string) (*store.Placement, error)
	DeletePlacement(ctx context.Context, id string) error
	ClosePlacement(ctx context.Context, id string) error
	SetSnapshot(ctx context.Context, id, snap string) error
	SetRestoredAs(ctx context.Context, id, to string) (string, error)
	FenceHost(ctx context.Context, host, keep string) ([]store.Placement, error)
	PutHost(ctx context.Context, h store.HostRecord) error
	GetHost(ctx context.Context, name string) (*store.HostRecord, error)
	Listen(ctx context.Context, fn func(payload string), connected func(bool))
	UpdateRun(ctx context.Context, id string, update func(*store.Run) error) (*store.Run, error)
	Prune(ctx context.Context, retention, maxLifetime time.Duration) (store.Pruned, error)
}

// Options configure a Gateway.
type Options struct {
	// Discovery finds the hosts. Required.
	Discovery Discovery
	// Cluster holds the sessions and hosts tables. Required.
	Cluster Cluster
	// Secret is the cell's shared secret, sent to hosts in
	// server.HeaderGatewaySecret. Required: hosts accept only gateways.
	Secret string
	// Tokens are the clients' bearer tokens, as on serve. If empty, no
	// authentication (only on loopback; see server.CheckBind).
	Tokens []string
	// AllowedHosts are extra Host header values accepted (as on serve).
	AllowedHosts []string
	// PublicMounts are handlers served without a token (the web UI).
	PublicMounts map[string]http.Handler
	// HealthInterval is how often every host is asked for /healthz. If zero, 1s.
	HealthInterval time.Duration
	// HealthTimeout bounds one health check. If zero, 2s.
	HealthTimeout time.Duration
	// LostAfter is how long a host may not answer before its sessions
	// are declared lost (410). If zero, 10s.
	LostAfter time.Duration
	// Retention is how long the rows of lost or closed sessions and of
	// hosts not seen are kept (410 Gone is answered for that long, 404
	// after). If zero, 24h.
	Retention time.Duration
	// MaxLifetime is the hosts' --max-lifetime: a session older cannot be
	// open, so its row goes Retention later. If zero, 12h (serve's default).
	MaxLifetime time.Duration
	// PruneInterval is how often the tables are pruned. If zero, 10 minutes.
	PruneInterval time.Duration
	// MaxBodyBytes caps the body of a request that places a session or
	// run (kept in memory to retry on another host). If zero, 32 MiB.
	MaxBodyBytes int64
	// Transport reaches the hosts. If nil, one tuned for many streams.
	Transport http.RoundTripper
	// PortDomains are wildcard domains besides localhost under which
	// PORT-ID.DOMAIN reaches a session's port (the operator's DNS points
	// *.DOMAIN at the gateways). The first names the URLs hosts hand out.
	PortDomains []string
	// Logger; if nil, logs are discarded.
	Logger *slog.Logger
}

// Gateway is the cell's HTTP front. Run must be running for it to know hosts.
type Gateway struct {
	opts     Options
	log      *slog.Logger
	mux      *http.ServeMux
	client   *http.Client
	proxy    *httputil.ReverseProxy
	hosts    *hosts
	routes   *routes
	tokens   server.Tokens
	front    server.Front
	draining atomic.Bool
	listenOK atomic.Bool
	rndMu    sync.Mutex
	rnd      *rand.Rand
	// slotsOnly places by free slots alone, as before issue 26: the
	// baseline of BenchmarkGatewayBurst.
	slotsOnly bool
	metrics   http.Handler
	// restoreMu serializes this gateway's restores of lost sessions
	// (restore.go), so requests racing for one make one new session;
	// gateways racing are settled by Cluster.SetRestoredAs.
	restoreMu sync.Mutex
}

// New returns a gateway; call Run to start its health rounds and its
// notification listener.
func New(o *Options) (*Gateway, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	switch {
	case opts.Discovery == nil:
		return nil, errors.New("gateway: a discovery is required")
	case opts.Cluster == nil:
		return nil, errors.New("gateway: a PostgreSQL database is required (--database)")
	case len(opts.Secret) < 32:
		return nil, errors.New("gateway: a shared secret of at least 32 characters is required (the hosts' --gateway-secret-file)")
	}
	if opts.HealthInterval <= 0 {
		opts.HealthInterval = time.Second
	}
	if opts.HealthTimeout <= 0 {
		opts.HealthTimeout = 2 * time.Second
	}
	if opts.LostAfter <= 0 {
		opts.LostAfter = 10 * time.Second
	}
	if opts.Retention <= 0 {
		opts.Retention = 24 * time.Hour
	}
	if opts.MaxLifetime <= 0 {
		opts.MaxLifetime = 12 * time.Hour
	}
	if opts.PruneInterval <= 0 {
		opts.PruneInterval = 10 * time.Minute
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 32 << 20
	}
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	g := &Gateway{opts: opts, log: opts.Logger, mux: http.NewServeMux(), routes: newRoutes(1 << 20),
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.client = &http.Client{Transport: opts.Transport}
	g.hosts = &hosts{g: g, m: map[string]*host{}}
	g.tokens = server.NewTokens(opts.Tokens)
	g.front = server.Front{Mux: g.mux, AllowedHosts: opts.AllowedHosts}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { g.rewrite(pr) },
		Transport:     opts.Transport,
		FlushInterval: -1, // every write goes out at once: NDJSON, SSE, MCP streams
		ErrorHandler:  g.proxyError,
		ModifyResponse: func(resp *http.Response) error {
			return g.afterResponse(resp)
		},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_cell_hosts_ready", Help: "Hosts taking new sessions."},
			func() float64 { r, _, _ := g.hosts.totals(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_cell_session_slots", Help: "Session slots of the ready hosts."},
			func() float64 { _, s, _ := g.hosts.totals(); return float64(s) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandloop_cell_sessions", Help: "Sessions held by the ready hosts."},
			func() float64 { _, _, u := g.hosts.totals(); return float64(u) }),
	)
	g.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	g.routesInit()
	return g, nil
}

func (g *Gateway) routesInit() {
	auth := g.requireToken
	g.mux.HandleFunc("GET /healthz", g.healthz)
	g.mux.HandleFunc("GET /readyz", g.readyz)
	g.mux.HandleFunc("GET /openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(server.OpenAPI())
	})
	g.mux.Handle("GET /metrics", g.metrics)
	g.mux.Handle("GET /v1/hosts", auth(http.HandlerFunc(g.listHosts)))
	g.mux.Handle("GET /v1/info", auth(http.HandlerFunc(g.info)))
	g.mux.Handle("POST /v1/sessions", auth(g.place(store.KindSession)))
	g.mux.Handle("GET /v1/sessions", auth(http.HandlerFunc(g.listSessions)))
	g.mux.Handle("/v1/sessions/{id}", auth(http.HandlerFunc(g.session)))
	g.mux.Handle("/v1/sessions/{id}/{rest...}", auth(http.HandlerFunc(g.session)))
	// The apps' own methods and paths; the host checks access (ports.go).
	g.mux.HandleFunc("/v1/sessions/{id}/ports/{port}/{path...}", g.servePortPath)
	g.mux.Handle("POST /v1/runs", auth(g.place(store.KindRun)))
	g.mux.Handle("GET /v1/runs", auth(http.HandlerFunc(g.anyHost)))
	g.mux.Handle("/v1/runs/{id}", auth(http.HandlerFunc(g.run)))
	g.mux.Handle("/v1/runs/{id}/{rest...}", auth(http.HandlerFunc(g.run)))
	g.mux.Handle("/mcp", auth(http.HandlerFunc(g.mcp)))
	for p, h := range g.opts.PublicMounts {
		g.mux.Handle(p, h)
	}
}

// Run keeps the view of the hosts and the route cache current until ctx ends.
func (g *Gateway) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() {
		g.opts.Cluster.Listen(ctx, g.routes.notify, func(ok bool) { g.listenOK.Store(ok) })
	})
	wg.Go(func() {
		// Every gateway prunes: the deletes are idempotent.
		t := time.NewTicker(g.opts.PruneInterval)
		defer t.Stop()
		for {
			if n, err := g.opts.Cluster.Prune(ctx, g.opts.Retention, g.opts.MaxLifetime); err != nil && ctx.Err() == nil {
				g.log.Warn("prune the sessions and hosts tables", "err", err)
			} else if n != (store.Pruned{}) {
				g.log.Info("pruned the sessions and hosts tables", "sessions", n.Sessions, "hosts", n.Hosts, "registrations", n.Registrations)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Go(func() {
		t := time.NewTicker(g.opts.HealthInterval)
		defer t.Stop()
		for {
			g.hosts.round(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	wg.Wait()
}

// Refresh runs one health round now (tests, and the first placement).
func (g *Gateway) Refresh(ctx context.Context) { g.hosts.round(ctx) }

// Hosts is this gateway's view of the cell.
func (g *Gateway) Hosts() []HostInfo { return g.hosts.snapshot() }

// Drain makes the gateway unready (its Service stops sending new
// connections); the caller then shuts the HTTP server down, which lets
// in-flight requests and streams finish.
func (g *Gateway) Drain() { g.draining.Store(true) }

// ServeHTTP admits the request as serve does (server.Front), then routes.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A port's host name (or E2B's headers) first, as serve does: its
	// paths are the app's, not the API's. A rebinding page cannot send
	// such a name, nor a cross-site one such headers without a preflight.
	if t, ok := g.portHost(r); ok {
		g.servePortHost(w, r, t)
		return
	}
	if g.front.Admit(w, r) {
		g.mux.ServeHTTP(w, r)
	}
}

type ownerKey struct{}

func ownerOf(ctx context.Context) string { s, _ := ctx.Value(ownerKey{}).(string); return s }

// hasOwner reports whether the request's caller was identified (every
// route but a port's, which may be reached without a token).
func hasOwner(ctx context.Context) bool { _, ok := ctx.Value(ownerKey{}).(string); return ok }

// requireToken is serve's token check: the caller's identity is the
// hash of its token, forwarded to hosts in server.HeaderOwner.
func (g *Gateway) requireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if owner, ok := g.tokens.Owner(w, r); ok {
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ownerKey{}, owner)))
		}
	})
}

func (g *Gateway) healthz(w http.ResponseWriter, r *http.Request) {
	ready, slots, used := g.hosts.totals()
	server.WriteJSON(w, http.StatusOK, map[string]any{"status": "ok", "hosts_ready": ready, "session_slots": slots, "sessions": used,
		"notifications": g.listenOK.Load()})
}

func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	if g.draining.Load() {
		server.WriteError(w, http.StatusServiceUnavailable, "draining", "this gateway is shutting down", 1)
		return
	}
	server.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (g *Gateway) listHosts(w http.ResponseWriter, r *http.Request) {
	server.WriteJSON(w, http.StatusOK, map[string]any{"hosts": g.hosts.snapshot()})
}

// target is where the proxy sends a request, with the epoch it must find.
type target struct {
	url   *url.URL
	epoch string
	pl    *store.Placement // the session the request is about, if any
	// port marks traffic to a session's port: the app's own request,
	// whose answers say nothing about the session's placement.
	port bool
	// portHost is "PORT-ID" of a port reached by its host name (the Host
	// header is kept for the app), sent as server.HeaderPortHost.
	portHost string
}

type targetKey struct{}

// forward proxies r to t.
//
// Full duplex: a host may answer (an execution's stream starts) before the
// transport has finished with the request's body; it reads once more past
// Content-Length to check the length. Without full duplex the HTTP/1
// server closes that body as the answer's headers go out, the transport's
// read fails ("invalid Read on closed Body"), and it closes the
// connection to the host, cutting the stream after its first line
// (golang/go#40747; TestCell's NDJSON check on a loaded machine).
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, t target) {
	if r.ProtoMajor == 1 {
		_ = http.NewResponseController(w).EnableFullDuplex()
	}
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

// rewrite sets the host, the secret and the caller's identity; the
// client's credentials do not travel further.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	pr.SetURL(t.url)
	h := pr.Out.Header
	ctx := pr.In.Context()
	if !t.port || ctx.Value(portAuthKey{}) != nil {
		h.Del("Authorization") // ours; a port's other Authorization is the app's
	}
	h.Set(server.HeaderGatewaySecret, g.opts.Secret)
	if hasOwner(ctx) {
		h.Set(server.HeaderOwner, ownerOf(ctx))
	} else {
		h.Del(server.HeaderOwner) // anonymous port traffic
	}
	scrubPortHeaders(h)
	// The name the client used, for the URLs a host hands out (ports,
	// previews): the gateway's, never the host's own.
	h.Set(server.HeaderForwardedHost, pr.In.Host)
	if pr.In.TLS != nil {
		h.Set(server.HeaderForwardedProto, "https")
	} else {
		h.Set(server.HeaderForwardedProto, "http")
	}
	if len(g.opts.PortDomains) > 0 {
		h.Set(server.HeaderPortDomain, g.opts.PortDomains[0])
	}
	if t.portHost != "" {
		h.Set(server.HeaderPortHost, t.portHost)
		pr.Out.Host = pr.In.Host
	}
	h.Del(server.HeaderEpoch)
	if t.epoch != "" {
		h.Set(server.HeaderEpoch, t.epoch)
	}
	if q := pr.Out.URL.Query(); q.Has("token") {
		q.Del("token")
		pr.Out.URL.RawQuery = q.Encode()
	}
}

// proxyError answers when a host cannot be reached: at once, never a hang.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	g.log.Warn("proxy", "path", r.URL.Path, "err", err)
	server.WriteError(w, http.StatusBadGateway, "host_unreachable", "the host of this session does not answer; retry shortly (if it stays away its sessions are declared lost: 410)", 1)
}

// afterResponse keeps the sessions table in step with what hosts answered.
func (g *Gateway) afterResponse(resp *http.Response) error {
	t, _ := resp.Request.Context().Value(targetKey{}).(target)
	if t.pl == nil || t.port {
		return nil
	}
	req := resp.Request
	gone := resp.StatusCode == http.StatusGone
	deleted := req.Method == http.MethodDelete && (resp.StatusCode < 300 || resp.StatusCode == http.StatusNotFound) &&
		(t.pl.Kind == store.KindMCP || strings.Count(strings.Trim(req.URL.Path, "/"), "/") == 2)
	if now := resp.Header.Get(server.HeaderEpoch); gone && now != "" && now != t.pl.Epoch {
		// The host says the epoch ended (it restarted before we noticed).
		go g.fence(context.WithoutCancel(req.Context()), t.pl.Host, now)
	}
	switch {
	case deleted && t.pl.ClosedAt.IsZero() && resp.StatusCode < 300:
		// Kept, marked closed, until pruned: its id still leads to its
		// host, which says when and why it closed.
		g.routes.drop(t.pl.ID)
		if err := g.opts.Cluster.ClosePlacement(req.Context(), t.pl.ID); err != nil {
			g.log.Warn("record a session's close", "session", t.pl.ID, "err", err)
		}
	case deleted && t.pl.ClosedAt.IsZero():
		// Gone before (its host closed it, idle or past its lifetime: the
		// host's 404 says when and why): forgotten, as the gateway would
		// otherwise say it was deleted now.
		g.routes.drop(t.pl.ID)
		if err := g.opts.Cluster.DeletePlacement(req.Context(), t.pl.ID); err != nil {
			g.log.Warn("forget session", "session", t.pl.ID, "err", err)
		}
	}
	if req.Method == http.MethodPost && resp.StatusCode == http.StatusCreated && t.pl.Kind == store.KindSession &&
		strings.HasSuffix(req.URL.Path, "/snapshots") && strings.Count(strings.Trim(req.URL.Path, "/"), "/") == 3 {
		return g.noteSnapshot(req, t.pl, resp)
	}
	if req.Method == http.MethodPost && resp.StatusCode == http.StatusCreated && t.pl.Kind == store.KindSession &&
		strings.HasSuffix(req.URL.Path, "/fork") && strings.Count(strings.Trim(req.URL.Path, "/"), "/") == 3 {
		return g.placeForks(req, t.pl, resp)
	}
	return nil
}

// placeForks records the sessions a fork made on its parent's host, so
// that they are reached through the gateway as any session is.
func (g *Gateway) placeForks(req *http.Request, parent *store.Placement, resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if err != nil {
		return err // the proxy answers 502
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var made struct {
		Sessions []struct {
			ID string `json:"id"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(b, &made); err != nil {
		g.log.Warn("fork: the host's answer is not JSON", "session", parent.ID, "err", err)
		return nil
	}
	for _, s := range made.Sessions {
		pl := store.Placement{ID: s.ID, Kind: store.KindSession, Owner: parent.Owner, Host: parent.Host, Epoch: parent.Epoch}
		if err := g.opts.Cluster.PutPlacement(req.Context(), pl); err != nil {
			// Without a record nobody could reach it: give it back.
			g.log.Warn("record a fork's placement", "session", s.ID, "err", err)
			g.undo(req, store.KindSession, parent.Host, s.ID)
			continue
		}
		g.routes.put(pl)
		g.hosts.placedOn(parent.Host)
	}
	return nil
}

// noteSnapshot records the snapshot a host just wrote of a session as
// its latest, from which it is restored if its host is lost.
func (g *Gateway) noteSnapshot(req *http.Request, pl *store.Placement, resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if err != nil {
		return err // the proxy answers 502
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	var made struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &made) != nil || made.ID == "" {
		g.log.Warn("snapshot: the host's answer has no id", "session", pl.ID)
		return nil
	}
	if err := g.opts.Cluster.SetSnapshot(req.Context(), pl.ID, made.ID); err != nil {
		g.log.Warn("record a session's snapshot", "session", pl.ID, "snapshot", made.ID, "err", err)
		return nil
	}
	g.routes.drop(pl.ID)
	return nil
}

// fence marks lost the sessions of host not placed under epoch keep ("":
// all of them), ends their runs as failed, and drops them from the cache.
func (g *Gateway) fence(ctx context.Context, host, keep string) {
	lost, err := g.opts.Cluster.FenceHost(ctx, host, keep)
	if err != nil {
		g.log.Warn("fence host", "host", host, "err", err)
		return
	}
	g.routes.dropHost(host)
	for _, pl := range lost {
		if pl.Kind != store.KindRun {
			continue
		}
		_, err := g.opts.Cluster.UpdateRun(ctx, pl.ID, func(r *store.Run) error {
			if r.Status == "running" {
				r.Status, r.Error = "failed", "the host running this run was lost"
			}
			return nil
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			g.log.Warn("end a lost run", "run", pl.ID, "err", err)
		}
	}
	if len(lost) > 0 {
		g.log.Info("sessions of an ended host epoch marked lost", "host", host, "sessions", len(lost))
	}
}

// lookup finds where a session lives: the cache, else the table.
func (g *Gateway) lookup(ctx context.Context, id string) (*store.Placement, error) {
	if pl, ok := g.routes.get(id); ok {
		return &pl, nil
	}
	pl, err := g.opts.Cluster.GetPlacement(ctx, id)
	if err != nil {
		return nil, err
	}
	g.routes.put(*pl)
	return pl, nil
}

// resolve turns a session id into where to send its requests, or writes
// the error: 404 (unknown, or another caller's), 410 (its host epoch
// ended), 502 (its host does not answer yet), 503 (no database).
func (g *Gateway) resolve(w http.ResponseWriter, r *http.Request, id, kind string) (target, bool) {
	return g.resolveFor(w, r, id, kind, true)
}

// resolveFor is resolve, checking the owner or not (port traffic: the
// host decides who passes).
func (g *Gateway) resolveFor(w http.ResponseWriter, r *http.Request, id, kind string, mine bool) (target, bool) {
	pl, err := g.lookup(r.Context(), id)
	if err == nil && (mine && pl.Owner != ownerOf(r.Context()) || pl.Kind != kind) {
		err = store.ErrNotFound
	}
	what := map[string]string{store.KindSession: "session", store.KindRun: "run", store.KindMCP: "MCP session"}[kind]
	switch {
	case errors.Is(err, store.ErrNotFound):
		server.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s %s: not found", what, id), 0)
		return target{}, false
	case err != nil:
		g.log.Warn("look up session", "session", id, "err", err)
		server.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the sessions table cannot be read; retry shortly", 1)
		return target{}, false
	}
	if !pl.ClosedAt.IsZero() {
		// Deleted through a gateway: its host says when and why, and
		// keeps its last events, for a while; after that, or without its
		// host, the gateway says what it knows.
		if u, epoch, reachable, known := g.hosts.get(pl.Host); known && reachable && epoch == pl.Epoch && time.Since(pl.ClosedAt) < hostKeepsClosed {
			return target{url: u, epoch: pl.Epoch, pl: pl}, true
		}
		server.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s %s was closed at %s: deleted by its owner", what, id, pl.ClosedAt.UTC().Format(time.RFC3339)), 0)
		return target{}, false
	}
	if pl.Lost {
		g.lost(w, r, pl, mine)
		return target{}, false
	}
	u, epoch, reachable, known := g.hosts.get(pl.Host)
	if known && epoch != "" && epoch != pl.Epoch {
		go g.fence(context.WithoutCancel(r.Context()), pl.Host, epoch)
		g.lost(w, r, pl, mine)
		return target{}, false
	}
	if !known || !reachable {
		// Another gateway of the cell may have declared the host lost
		// already (its health rounds run apart from this one's): the
		// table, not the cache, says so, and every gateway then answers
		// alike.
		if cur, err := g.opts.Cluster.GetPlacement(r.Context(), id); err == nil && cur.Lost {
			g.routes.drop(id)
			g.lost(w, r, cur, mine)
			return target{}, false
		}
		server.WriteError(w, http.StatusBadGateway, "host_unreachable", "the host of this session does not answer; retry shortly (if it stays away its sessions are declared lost: 410)", 1)
		return target{}, false
	}
	return target{url: u, epoch: pl.Epoch, pl: pl}, true
}

// hostKeepsClosed is how long a host tells of a closed session
// (session.ClosedEventsKept, which this package does not import).
const hostKeepsClosed = time.Hour

func writeGone(w http.ResponseWriter, pl *store.Placement) {
	server.WriteError(w, http.StatusGone, "host_lost", fmt.Sprintf("the host of %s %s was lost (it restarted or stopped answering): its state is gone; create a new one", pl.Kind, pl.ID), 0)
}

// session proxies /v1/sessions/{id}/... to the session's host.
func (g *Gateway) session(w http.ResponseWriter, r *http.Request) {
	if t, ok := g.resolve(w, r, r.PathValue("id"), store.KindSession); ok {
		g.forward(w, r, t)
	}
}

// run proxies /v1/runs/{id}/... to the host running it (its live events
// are there); a finished run, or one whose host was lost, is read from
// the shared history through any host.
func (g *Gateway) run(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	pl, err := g.lookup(r.Context(), id)
	if err == nil && pl.Owner == ownerOf(r.Context()) && !pl.Lost {
		if u, epoch, reachable, _ := g.hosts.get(pl.Host); reachable && epoch == pl.Epoch {
			g.forward(w, r, target{url: u, epoch: pl.Epoch, pl: pl})
			return
		}
	}
	g.anyHost(w, r)
}

// anyHost proxies a request every host can answer (the shared history).
func (g *Gateway) anyHost(w http.ResponseWriter, r *http.Request) {
	c := g.hosts.reachableHosts()
	if len(c) == 0 {
		server.WriteError(w, http.StatusServiceUnavailable, "no_hosts", "no host answers; retry shortly", 1)
		return
	}
	g.forward(w, r, target{url: c[g.randN(len(c))]})
}

// randN is a random number in [0, n), for choices among equals.
func (g *Gateway) randN(n int) int {
	g.rndMu.Lock()
	defer g.rndMu.Unlock()
	return g.rnd.IntN(n)
}

// mcp routes an MCP session by its Mcp-Session-Id; a request without one
// (initialize) places a new MCP session on a host.
func (g *Gateway) mcp(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" {
		g.place(store.KindMCP).ServeHTTP(w, r)
		return
	}
	if t, ok := g.resolve(w, r, id, store.KindMCP); ok {
		g.forward(w, r, t)
	}
}

// info answers GET /v1/info as serve does: what runs use comes from a
// host (they are all started alike), whether a token is needed from the
// gateway, which is what checks tokens (hosts take only its secret).
func (g *Gateway) info(w http.ResponseWriter, r *http.Request) {
	var in server.Info
	for _, u := range g.hosts.reachableHosts() {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.JoinPath("/v1/info").String(), nil)
		if err != nil {
			continue
		}
		req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
		req.Header.Set(server.HeaderOwner, ownerOf(r.Context()))
		resp, err := g.client.Do(req)
		if err != nil {
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(&in)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && err == nil {
			in.TokenRequired = len(g.tokens) > 0
			server.WriteJSON(w, http.StatusOK, in)
			return
		}
		in = server.Info{}
	}
	server.WriteError(w, http.StatusServiceUnavailable, "no_hosts", "no host answers; retry shortly", 1)
}

// listSessions merges the caller's sessions of every reachable host.
func (g *Gateway) listSessions(w http.ResponseWriter, r *http.Request) {
	type result struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	urls := g.hosts.reachableHosts()
	results := make([]result, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.JoinPath("/v1/sessions").String(), nil)
			if err != nil {
				return
			}
			req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
			req.Header.Set(server.HeaderOwner, ownerOf(r.Context()))
			resp, err := g.client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				_ = json.NewDecoder(resp.Body).Decode(&results[i])
			}
		})
	}
	wg.Wait()
	all := []json.RawMessage{}
	for _, res := range results {
		all = append(all, res.Sessions...)
	}
	server.WriteJSON(w, http.StatusOK, map[string]any{"sessions": all})
}

// copyResponse writes resp to w, flushing as it goes (an MCP initialize
// may answer with an event stream).
func copyResponse(w http.ResponseWriter, resp *http.Response) {
	for k, vs := range resp.Header {
		if k == "Connection" || k == "Keep-Alive" || k == "Transfer-Encoding" || k == "Trailer" || k == "Upgrade" {
			continue
		}
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}
