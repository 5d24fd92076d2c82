// Package server serves sandloop's HTTP API: sessions, executions
// (JSON, NDJSON or SSE), files, metrics and the OpenAPI description.
package server

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/portproxy"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/template"
)

//go:embed openapi.yaml
var openapiYAML []byte

// Options configure a Server.
type Options struct {
	// Manager holds the sessions. Required.
	Manager *session.Manager
	// Tokens are the accepted bearer tokens. If empty, no authentication
	// (allowed only on loopback; see CheckBind).
	Tokens []string
	// AllowedHosts are extra Host header values accepted besides
	// localhost, 127.0.0.1 and [::1] (defence against DNS rebinding).
	AllowedHosts []string
	// AllowNetwork lets sessions ask for the host's network.
	AllowNetwork bool
	// Egress configures allow mode (an allowlist proxy per session).
	Egress EgressOptions
	// MaxBodyBytes caps JSON request bodies. If zero, 4 MiB.
	MaxBodyBytes int64
	// MaxFileBytes caps one uploaded file; MaxWorkspaceBytes a workspace.
	// If zero, 100 MiB and 1 GiB.
	MaxFileBytes, MaxWorkspaceBytes int64
	// Keepalive is the interval of keepalive events in streams. If zero, 5s.
	Keepalive time.Duration
	// Logger receives request logs. If nil, they are discarded.
	Logger *slog.Logger
	// Extra handlers mounted by other packages (e.g. "/mcp"), behind the token check.
	Mounts map[string]http.Handler
	// PublicMounts are extra handlers reachable without a token, such as the
	// web UI's page and static assets (which hold no data: every API call the
	// page makes carries the token). The Host and cross-origin checks still apply.
	PublicMounts map[string]http.Handler
	// Runs and Store serve /v1/runs. If nil, those routes answer 501.
	Runs  *runs.Service
	Store store.History
	// Templates serves /v1/templates (and must be the Manager's
	// ManagerOptions.Templates). If nil, the list is empty.
	Templates *template.Pool
	// Lessons serves /v1/lessons. If nil, those routes answer 501.
	Lessons store.LessonStore
	// MaxRunBodyBytes caps a run's request (task and files). If zero, 32 MiB.
	MaxRunBodyBytes int64
	// MaxNotebookBytes caps a session's notebook (PUT .../notebook). If
	// zero, DefaultMaxNotebookBytes.
	MaxNotebookBytes int64
	// NotebookDir, if set, keeps each session's notebook there too (a
	// file per session, 0600), for the next server when sessions outlive
	// this one (a keeper, sessions put to sleep at shutdown): its web UI
	// then shows the cells as they were. New removes the files of
	// sessions the manager does not hold.
	NotebookDir string
	// GatewaySecret, if set, makes this server a host of a cell: every
	// request but the public routes must carry it in HeaderGatewaySecret
	// (only the cell's gateways know it), and HeaderOwner names the caller
	// the gateway authenticated. Tokens are then not accepted: clients
	// reach hosts only through a gateway.
	GatewaySecret string
	// Dispatch, if set, takes requests that a face routes by their headers
	// rather than their paths (E2B's E2b-Sandbox-Port for a sandbox's own
	// ports, whose paths are the app's), before the path routes; it returns
	// nil for requests that are not its own. The face checks access itself.
	Dispatch func(*http.Request) http.Handler
	// PortDomains are wildcard domains besides localhost under which
	// PORT-ID.DOMAIN reaches a session's port (an operator's DNS points
	// *.DOMAIN at the server). The first names the URLs handed out.
	PortDomains []string
	// Epoch names this process's life as a host (a new one per start). A
	// request carrying HeaderEpoch of another life gets 410 Gone: its
	// session belonged to a previous process. If empty, not checked.
	Epoch string
}

// Headers between a cell's gateway and its hosts.
const (
	HeaderGatewaySecret = "X-Sandloop-Gateway-Secret"
	HeaderOwner         = "X-Sandloop-Owner"
	HeaderEpoch         = "X-Sandloop-Epoch"
	// HeaderPortHost, from a gateway, says the request is for a session's
	// port by a host name (PORT-ID.DOMAIN, or E2B's headers), and names
	// it: "PORT-ID". The Host header stays the one the user typed.
	HeaderPortHost = "X-Sandloop-Port-Host"
	// HeaderPortDomain is the gateway's first port domain, under which
	// the URLs of ports a host hands out are named.
	HeaderPortDomain = "X-Sandloop-Port-Domain"
	// HeaderForwardedHost and HeaderForwardedProto are the name and scheme
	// the client used at the gateway, for the URLs a host hands out.
	HeaderForwardedHost  = "X-Forwarded-Host"
	HeaderForwardedProto = "X-Forwarded-Proto"
)

// EgressOptions configure sessions in allow mode.
type EgressOptions struct {
	// DefaultMode is the mode of a session that asks for none: none or
	// allow. If empty, none.
	DefaultMode egress.Mode
	// Default is the allowlist of a session in allow mode that lists
	// nothing. If empty, such a session must list what it needs.
	Default []string
	// Max bounds what a session may list. If nil, any host names, and no
	// addresses or ranges.
	Max *egress.Allowlist
	// Policy holds the caps, timeouts and denied addresses (the server's
	// own) every session's policy starts from.
	Policy egress.Policy
}

// DefaultPolicy is the policy of a session that asks for no mode when
// the default is allow (nil otherwise), for session.ManagerOptions.DefaultEgress.
func (o EgressOptions) DefaultPolicy() *egress.Policy {
	if o.DefaultMode != egress.ModeAllow || len(o.Default) == 0 {
		return nil
	}
	al, err := egress.ParseAllowlist(o.Default)
	if err != nil {
		return nil
	}
	p := o.Policy
	p.Allow = al
	return &p
}

// Server is the HTTP API.
type Server struct {
	opts    Options
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics
	tokens  Tokens
	front   Front
	// draining is set by Drain: no new sessions or runs, readiness false.
	draining atomic.Bool
	// notebooks are the sessions' notebooks (notebook.go).
	notebooks notebooks
	// signer signs the URLs of sessions' ports (ports.go).
	signer *portproxy.Signer
}

// route is one documented endpoint.
type route struct {
	method, pattern string
	handler         http.HandlerFunc
	public          bool // no token needed
}

// New returns the API server.
func New(o *Options) (*Server, error) {
	opts := *cmp.Or(o, &Options{}) // nil: every default
	if opts.Manager == nil {
		return nil, errors.New("server: a session manager is required")
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.MaxWorkspaceBytes == 0 {
		opts.MaxWorkspaceBytes = 1 << 30
	}
	if opts.MaxRunBodyBytes == 0 {
		opts.MaxRunBodyBytes = DefaultMaxRunBodyBytes
	}
	if opts.Keepalive == 0 {
		opts.Keepalive = 5 * time.Second
	}
	s := &Server{opts: opts, log: opts.Logger, mux: http.NewServeMux(), signer: portproxy.NewSigner()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.tokens = NewTokens(opts.Tokens)
	s.sweepNotebooks()
	// A cell's host: see Front.NoBrowserChecks.
	s.front = Front{Mux: s.mux, AllowedHosts: opts.AllowedHosts, NoBrowserChecks: opts.GatewaySecret != ""}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.metrics = newMetrics(reg, opts.Manager)
	for _, rt := range s.routes() {
		h := http.Handler(rt.handler)
		if !rt.public {
			h = s.requireToken(h)
		}
		s.mux.Handle(rt.method+" "+rt.pattern, h)
	}
	// Metrics tell how busy the server is and what fails: with tokens, a
	// scraper sends one (Prometheus: authorization.credentials). A cell's
	// host keeps them open to its cluster's Prometheus (its autoscaler
	// reads them), as it keeps /healthz open to the gateways.
	metricsH := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if opts.GatewaySecret == "" {
		metricsH = s.requireToken(metricsH)
	}
	s.mux.Handle("GET /metrics", metricsH)
	for p, h := range opts.Mounts {
		s.mux.Handle(p, s.requireToken(h))
	}
	for p, h := range opts.PublicMounts {
		s.mux.Handle(p, h)
	}
	return s, nil
}

// The limits of request bodies, when Options leave them zero (serve's
// --max-body, --max-upload and --max-run-body).
const (
	DefaultMaxBodyBytes    = 4 << 20
	DefaultMaxFileBytes    = 100 << 20
	DefaultMaxRunBodyBytes = 32 << 20
)

func (s *Server) routes() []route {
	return []route{
		{"GET", "/healthz", s.healthz, true},
		{"GET", "/readyz", s.readyz, true},
		{"GET", "/openapi.yaml", s.openapi, true},
		{"GET", "/v1/info", s.info, false},
		{"POST", "/v1/sessions", s.createSession, false},
		{"GET", "/v1/sessions", s.listSessions, false},
		{"GET", "/v1/sessions/{id}", s.getSession, false},
		{"DELETE", "/v1/sessions/{id}", s.deleteSession, false},
		{"POST", "/v1/sessions/{id}/execute", s.execute, false},
		{"POST", "/v1/sessions/{id}/interrupt", s.interrupt, false},
		{"POST", "/v1/sessions/{id}/restart", s.restart, false},
		{"GET", "/v1/sessions/{id}/network", s.sessionNetwork, false},
		{"PATCH", "/v1/sessions/{id}/network", s.updateNetwork, false},
		{"POST", "/v1/sessions/{id}/pause", s.pauseSession, false},
		{"POST", "/v1/sessions/{id}/resume", s.resumeSession, false},
		{"POST", "/v1/sessions/{id}/undo", s.undo, false},
		{"GET", "/v1/sessions/{id}/checkpoints", s.listCheckpoints, false},
		{"POST", "/v1/sessions/{id}/checkpoints", s.takeCheckpoint, false},
		{"DELETE", "/v1/sessions/{id}/checkpoints/{cid}", s.deleteCheckpoint, false},
		{"POST", "/v1/sessions/{id}/checkpoints/{cid}/restore", s.restoreCheckpoint, false},
		{"POST", "/v1/sessions/{id}/fork", s.forkSession, false},
		{"POST", "/v1/sessions/{id}/snapshots", s.takeSnapshot, false},
		{"GET", "/v1/sessions/{id}/snapshots", s.listSnapshots, false},
		{"POST", "/v1/sessions/{id}/hibernate", s.hibernateSession, false},
		{"GET", "/v1/snapshots", s.listSnapshots, false},
		{"GET", "/v1/snapshots/{sid}", s.getSnapshot, false},
		{"DELETE", "/v1/snapshots/{sid}", s.deleteSnapshot, false},
		{"GET", "/v1/sessions/{id}/files", s.listFiles, false},
		{"GET", "/v1/sessions/{id}/files/{path...}", s.getFile, false},
		{"PUT", "/v1/sessions/{id}/files/{path...}", s.putFile, false},
		{"DELETE", "/v1/sessions/{id}/files/{path...}", s.deleteFile, false},
		{"GET", "/v1/sessions/{id}/archive", s.archive, false},
		{"GET", "/v1/sessions/{id}/metrics", s.sessionMetrics, false},
		{"GET", "/v1/sessions/{id}/events", s.sessionEvents, false},
		{"GET", "/v1/sessions/{id}/ports", s.listPorts, false},
		{"POST", "/v1/sessions/{id}/previews", s.portURL, false},
		// The app's own methods; its access is checked by proxyPort.
		{"GET", "/v1/sessions/{id}/ports/{port}/{path...}", s.proxyPort, true},
		{"POST", "/v1/sessions/{id}/ports/{port}/{path...}", s.proxyPort, true},
		{"PUT", "/v1/sessions/{id}/ports/{port}/{path...}", s.proxyPort, true},
		{"PATCH", "/v1/sessions/{id}/ports/{port}/{path...}", s.proxyPort, true},
		{"DELETE", "/v1/sessions/{id}/ports/{port}/{path...}", s.proxyPort, true},
		{"GET", "/v1/sessions/{id}/notebook", s.getNotebook, false},
		{"PUT", "/v1/sessions/{id}/notebook", s.putNotebook, false},
		{"GET", "/v1/sessions/{id}/notebook.ipynb", s.getNotebookIpynb, false},
		{"PUT", "/v1/sessions/{id}/notebook.ipynb", s.putNotebookIpynb, false},
		{"GET", "/v1/sessions/{id}/terminal", s.terminal, false},
		{"POST", "/v1/runs", s.startRun, false},
		{"GET", "/v1/runs", s.listRuns, false},
		{"GET", "/v1/runs/{id}", s.getRun, false},
		{"GET", "/v1/runs/{id}/events", s.runEvents, false},
		{"POST", "/v1/runs/{id}/cancel", s.cancelRun, false},
		{"GET", "/v1/runs/{id}/artifacts", s.runArtifacts, false},
		{"GET", "/v1/lessons", s.listLessons, false},
		{"POST", "/v1/lessons", s.postLesson, false},
		{"GET", "/v1/lessons/{id}", s.getLesson, false},
		{"DELETE", "/v1/lessons/{id}", s.deleteLesson, false},
		{"GET", "/v1/templates", s.listTemplates, false},
		{"GET", "/v1/templates/{name}", s.getTemplate, false},
		{"DELETE", "/v1/templates/{name}", s.deleteTemplate, false},
	}
}

// Routes lists "METHOD /pattern" of every API route, for documentation checks.
func (s *Server) Routes() []string {
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.method+" "+rt.pattern)
	}
	return append(out, "GET /metrics")
}

// ServeHTTP applies the browser defences, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if s.opts.GatewaySecret != "" {
		// A cell's host: every request carries the gateway's secret, or is
		// one of the probes (kubelet's, Prometheus') that read nothing of
		// a session. Checked before anything else routes the request, so
		// no route (a port's host name, E2B's headers or mounts, the web
		// UI) is reached around the gateway, whatever it would accept.
		if !s.fromGateway(r) {
			if !openOnCellHost(r) {
				writeError(w, errNotGateway)
				return
			}
		} else if label := r.Header.Get(HeaderPortHost); label != "" {
			t, ok := portproxy.ParseHost(label+".localhost", nil)
			if !ok {
				writeError(w, badRequest("%s %q: want PORT-SESSIONID", HeaderPortHost, label))
				return
			}
			s.serveHostPort(w, r, t)
			return
		}
	} else if t, ok := portproxy.ParseHost(r.Host, s.opts.PortDomains); ok {
		s.serveHostPort(w, r, t)
		return
	}
	if s.opts.Dispatch != nil {
		// A browser page cannot send such headers without a CORS preflight,
		// which is never granted: no DNS-rebinding or CSRF way in.
		if h := s.opts.Dispatch(r); h != nil {
			h.ServeHTTP(w, r)
			return
		}
	}
	if !s.front.Admit(w, r) {
		return
	}
	if e := r.Header.Get(HeaderEpoch); e != "" && s.opts.Epoch != "" && e != s.opts.Epoch {
		w.Header().Set(HeaderEpoch, s.opts.Epoch) // the epoch that replaced it
		writeError(w, &apiError{http.StatusGone, "host_lost", "the host of this session restarted: the session is gone; create a new one", 0})
		return
	}
	sw := &statusWriter{ResponseWriter: w, status: 200}
	s.mux.ServeHTTP(sw, r)
	// Probes (every 200ms from each gateway of a cell) would drown the
	// log at INFO.
	level := slog.LevelInfo
	if r.URL.Path == "/healthz" {
		level = slog.LevelDebug
	}
	s.log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path, "status", sw.status, "duration", time.Since(start))
}

// statusWriter records the status for logs; it passes Flush through so
// streaming works.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) { w.status = code; w.ResponseWriter.WriteHeader(code) }
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requireToken checks the bearer token (or ?token= where queryTokenRoutes
// allow it) and stores the caller's identity.
func (s *Server) requireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.opts.GatewaySecret != "" {
			if !s.fromGateway(r) {
				writeError(w, errNotGateway)
				return
			}
			h.ServeHTTP(w, r.WithContext(withOwner(r.Context(), r.Header.Get(HeaderOwner))))
			return
		}
		if len(s.tokens) == 0 {
			h.ServeHTTP(w, r)
			return
		}
		if owner, ok := s.tokens.Owner(w, r); ok {
			h.ServeHTTP(w, r.WithContext(withOwner(r.Context(), owner)))
		}
	})
}

// errNotGateway refuses a request to a cell's host that does not come
// from one of its gateways.
var errNotGateway = &apiError{http.StatusUnauthorized, "unauthorized", "this host serves only its cell's gateways", 0}

// fromGateway reports whether r carries the cell's secret.
func (s *Server) fromGateway(r *http.Request) bool {
	return s.opts.GatewaySecret != "" &&
		subtle.ConstantTimeCompare([]byte(r.Header.Get(HeaderGatewaySecret)), []byte(s.opts.GatewaySecret)) == 1
}

// openOnCellHost are the requests a cell's host answers without the
// gateway's secret: the probes of the kubelet (/healthz, /readyz) and of
// the cluster's Prometheus (/metrics, which its autoscaler reads). None
// names a session; on a port's host name they would reach the app, so
// such a name is never open.
func openOnCellHost(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics":
	default:
		return false
	}
	_, portHost := portproxy.ParseHost(r.Host, nil)
	return !portHost && r.Header.Get("E2b-Sandbox-Id") == ""
}

// OwnerOf names a token's owner without keeping the token: the owner of
// the sessions created with it, as the API records it (for other faces of
// the server that map their own credentials onto sandloop's tokens, and
// for a cell's gateway).
func OwnerOf(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	st := s.opts.Manager.Stats()
	h := Health{Status: "ok", Sessions: st.Sessions, Paused: st.Paused, PoolReady: st.PoolReady,
		PoolTarget: st.PoolTarget, PoolReason: st.PoolReason, SparesReady: st.Spares, Starting: st.Starting,
		MaxSessions: st.MaxSessions, Epoch: s.opts.Epoch, Draining: s.draining.Load()}
	// The templates are told to the cell's gateways only (the probe is
	// public): they place a session that names one on a host that has it.
	if s.opts.GatewaySecret != "" && s.opts.Templates != nil &&
		subtle.ConstantTimeCompare([]byte(r.Header.Get(HeaderGatewaySecret)), []byte(s.opts.GatewaySecret)) == 1 {
		h.Templates = []string{}
		if ts, err := s.opts.Templates.Store().List(); err == nil {
			for _, t := range ts {
				h.Templates = append(h.Templates, t.Name)
			}
		}
	}
	WriteJSON(w, http.StatusOK, h)
}

// Health is what /healthz answers; a cell's gateways place sessions by it.
type Health struct {
	Status   string `json:"status"`
	Sessions int    `json:"sessions"`
	// Paused of them take no slot: free slots are MaxSessions - (Sessions - Paused).
	Paused    int `json:"paused"`
	PoolReady int `json:"pool_ready"`
	// PoolTarget is how many kernels the pool keeps ready now, PoolReason
	// why (session.Stats).
	PoolTarget int    `json:"pool_target"`
	PoolReason string `json:"pool_reason,omitempty"`
	// SparesReady are the zygote's armed spares waiting for a fork:
	// with PoolReady, the sessions that would start without waiting for
	// a fork (session.Stats.Spares).
	SparesReady int `json:"spares_ready"`
	// Starting are creates under way (in line for a pooled kernel or
	// starting one); each holds a slot.
	Starting    int    `json:"starting"`
	MaxSessions int    `json:"max_sessions"`
	Epoch       string `json:"epoch,omitempty"`
	Draining    bool   `json:"draining"`
	// Templates are the host's templates by name (only in the answer to a
	// request carrying the cell's gateway secret; nil otherwise).
	Templates []string `json:"templates,omitempty"`
}

// readyz is the readiness probe: false once draining, so Kubernetes and
// the gateways stop sending new work.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeError(w, errDraining)
		return
	}
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// errDraining refuses new sessions and runs on a draining server.
var errDraining = &apiError{http.StatusServiceUnavailable, "draining", "this server is shutting down and takes no new sessions; retry (a gateway places it elsewhere)", 1}

// Drain stops taking new sessions and runs; existing ones keep working.
func (s *Server) Drain() { s.draining.Store(true) }

// Draining reports whether Drain was called.
func (s *Server) Draining() bool { return s.draining.Load() }

// WriteError writes the API's JSON error shape, for other faces of the
// same API (the gateway).
func WriteError(w http.ResponseWriter, status int, code, message string, retryAfter int) {
	writeError(w, &apiError{status, code, message, retryAfter})
}

// OpenAPI is the API's description, served as /openapi.yaml.
func OpenAPI() []byte { return openapiYAML }

func (s *Server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Write(openapiYAML)
}

// CheckBind refuses to serve on a non-loopback address without a token.
func CheckBind(addr string, tokens []string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %v (use HOST:PORT, e.g. 127.0.0.1:8080)", addr, err)
	}
	hasToken := false
	for _, t := range tokens {
		hasToken = hasToken || t != ""
	}
	if hasToken {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to serve on %s without a token: anyone who can reach it could run code; set --token, SANDLOOP_TOKEN or --token-file, or bind to 127.0.0.1", addr)
}

// LoadTokens gathers tokens from a flag value, the SANDLOOP_TOKEN
// variable and a file with one token per line.
func LoadTokens(flagTokens []string, file string) ([]string, error) {
	var out []string
	for _, t := range flagTokens {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	if t := strings.TrimSpace(os.Getenv("SANDLOOP_TOKEN")); t != "" {
		out = append(out, t)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				out = append(out, line)
			}
		}
	}
	for _, t := range out {
		if len(t) < 16 {
			return nil, fmt.Errorf("a token must be at least 16 characters long")
		}
	}
	return out, nil
}
