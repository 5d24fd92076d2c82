package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/sandloop/sandloop/internal/llm"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	neturl "net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/webui"
	"github.com/spf13/cobra"
)

// serveMounts lets other files of this package mount handlers (e.g. /mcp).
var serveMounts []func(m *session.Manager, mounts map[string]http.Handler) error

func newServeCmd() *cobra.Command {
	var (
		addr, dataDir, tokenFile string
		database                 string
		pricesFile               string
		model                    string
		tokens, allowedHosts     []string
		pool, maxSessions        int
		idle, lifetime, execTO   time.Duration
		def, max                 limitFlags
		allowNetwork, jsonLogs   bool
		gatewaySecretFile        string
		drainTimeout             time.Duration
		register                 string
		heartbeat                time.Duration
		allow, allowMax          []string
		defaultNetwork           string
		useE2B                   bool
		zygoteFlag               zygoteMode
		maxBody, maxUpload       int64
		maxRunBody               int64
		wheelCache, pipIndex     string
		wheelCacheSize           int64 = egress.DefaultCacheBytes
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (sessions, files, metrics) with a warm pool of sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			toks, err := server.LoadTokens(tokens, tokenFile)
			if err != nil {
				return usagef("%v", err)
			}
			secret, err := loadGatewaySecret(gatewaySecretFile)
			if err != nil {
				return usagef("%v", err)
			}
			// A cell's host needs no token on other interfaces: the secret guards it.
			if err := server.CheckBind(addr, append(slices.Clone(toks), secret)); err != nil {
				return usagef("%v", err)
			}
			var self gateway.Target
			if register != "" {
				if self, err = gateway.ParseHostURL(register); err != nil {
					return usagef("--register: %v", err)
				}
				if secret == "" || !store.IsPostgresURL(cmp.Or(database, os.Getenv("SANDLOOP_DATABASE_URL"))) {
					return usagef("--register makes this a cell's host: it needs --gateway-secret-file and --database postgres://...")
				}
			}
			defaults, err := def.limits()
			if err != nil {
				return err
			}
			maxima, err := max.limits()
			if err != nil {
				return err
			}
			if err := checkDiskFits("--max-", maxima, defaults); err != nil {
				return err
			}
			eg, err := egressOptions(defaultNetwork, allow, allowMax)
			if err != nil {
				return err
			}
			defEgress := eg.DefaultPolicy() // (its Deny is set once the server listens)
			if pool < 0 || maxSessions < 0 {
				return usagef("--pool and --max-sessions must not be negative")
			}
			var handler slog.Handler = slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelInfo})
			if jsonLogs {
				handler = slog.NewJSONHandler(cmd.ErrOrStderr(), nil)
			}
			log := slog.New(handler)
			var zy session.Zygote
			z, err := startZygote(cmd.Context(), zygoteFlag, log)
			if err != nil {
				return err
			}
			if z != nil {
				defer z.Close() // after the manager has closed its sessions
				zy = z
			}
			cache, err := openWheelCache(wheelCache, dataDir, wheelCacheSize, pipIndex, log)
			if err != nil {
				return err
			}
			mgr := session.NewManager(session.ManagerOptions{
				PoolSize: pool, MaxSessions: maxSessions, IdleTimeout: idle, MaxLifetime: lifetime,
				Defaults: defaults, Max: maxima, DefaultEgress: defEgress, ExecTimeout: execTO, Logger: log, Zygote: zy,
				EgressCache: cache,
			})
			defer mgr.Close()
			mounts := map[string]http.Handler{}
			for _, mount := range serveMounts {
				if err := mount(mgr, mounts); err != nil {
					return err
				}
			}
			st, err := openStore(cmd.Context(), dataDir, database)
			if err != nil {
				return err
			}
			defer st.Close()
			pg, _ := st.(*store.Postgres)
			if register != "" && pg == nil {
				return usagef("--register needs the cell's PostgreSQL (--database postgres://...)")
			}
			ls := lessonStore(st, cmd.ErrOrStderr(), false)
			svc := runs.New(runs.Options{
				Store: st, Lessons: ls, Provider: defaultModel(model, providerResolver(pricesFile)), Logger: log,
				NewSession: runs.ManagerSessions(mgr),
			})
			defer svc.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usagef("cannot listen on %s: %v", addr, err)
			}
			defer ln.Close()
			// Sandboxes never reach this server through their proxy, even
			// where an allowlist opens loopback.
			if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
				eg.Policy.Deny = append(eg.Policy.Deny, ap, netip.AddrPortFrom(netip.IPv4Unspecified(), ap.Port()))
			}
			if defEgress != nil {
				defEgress.Deny = eg.Policy.Deny
			}
			// The page and its assets hold no data; the page sends the token with every API call.
			public := webui.Mounts()
			e2bKey := ""
			var e2bH io.Closer
			if useE2B {
				h, key, err := newE2B(mgr, toks, zy, lifetime, log)
				if err != nil {
					return err
				}
				e2bH = h
				defer h.Close() // (closed below; again is harmless)
				for p, m := range h.Mounts() {
					public[p] = m // authenticated by the E2B handler itself
				}
				e2bKey = key
			}
			epoch := newEpoch()
			srv, err := server.New(server.Options{
				GatewaySecret: secret, Epoch: epoch,
				Manager: mgr, Tokens: toks, AllowedHosts: allowedHosts, AllowNetwork: allowNetwork, Egress: eg,
				Logger: log, Mounts: mounts, Runs: svc, Store: st, Lessons: ls,
				PublicMounts: public,
				MaxBodyBytes: maxBody, MaxFileBytes: maxUpload, MaxRunBodyBytes: maxRunBody,
			})
			if err != nil {
				return err
			}
			hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			url := "http://" + ln.Addr().String()
			if len(toks) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "sandloop serving on %s (token required)\n", url)
				fmt.Fprintf(cmd.OutOrStdout(), "web UI: %s/?token=%s\n", url, neturl.QueryEscape(toks[0]))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "sandloop serving on %s\n", url)
				fmt.Fprintf(cmd.OutOrStdout(), "web UI: %s/\n", url)
			}
			if useE2B {
				printE2B(cmd.OutOrStdout(), url, e2bKey)
			}
			fmt.Fprintln(cmd.OutOrStdout(), modelLine(ctx, model, pricesFile))
			if r := jail.Probe(); !r.Cgroups.OK {
				log.Warn("cgroups unavailable: limits fall back to rlimits", "detail", r.Cgroups.Detail)
			}
			// A registered host renews its row while it serves (not
			// ready once draining) and removes it when it is done.
			stopRegister := func() {}
			if register != "" {
				rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
				done := make(chan struct{})
				go func() {
					defer close(done)
					gateway.Register(rctx, pg, heartbeat, func() store.Registration {
						st := mgr.Stats()
						return store.Registration{Name: self.Name, URL: self.URL, Epoch: epoch, Ready: !srv.Draining(),
							Slots: st.MaxSessions, Used: st.Sessions}
					}, log)
				}()
				stopRegister = func() { cancel(); <-done }
				defer stopRegister()
			}
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			if drainTimeout > 0 {
				drain(log, srv, mgr, drainTimeout)
			}
			stopRegister()
			log.Info("shutting down: closing every session")
			// Mounted handlers that hold connections open (MCP event
			// streams) are closed first, so Shutdown does not wait on them.
			for _, h := range mounts {
				if c, ok := h.(io.Closer); ok {
					c.Close()
				}
			}
			// No new connections from here on; the sessions are killed
			// while Shutdown waits, so the streams of clients waiting on
			// them (a command's output, a cell's events) end, and nothing
			// waits on a user process or a client for long (issue 24).
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			shut := make(chan error, 1)
			go func() { shut <- hs.Shutdown(sctx) }()
			if e2bH != nil {
				e2bH.Close() // before the manager closes the sessions
			}
			closeErr := mgr.Close()
			if err := <-shut; err != nil && !errors.Is(err, context.DeadlineExceeded) {
				log.Warn("shutdown", "err", err)
			}
			return closeErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (HOST:PORT)")
	f.StringVar(&dataDir, "data-dir", defaultDataDir(), "where run history is kept")
	f.StringVar(&database, "database", "", databaseHelp)
	f.StringArrayVar(&tokens, "token", nil, "accepted bearer token (repeatable; also SANDLOOP_TOKEN)")
	f.StringVar(&tokenFile, "token-file", "", "file with accepted tokens, one per line")
	f.StringArrayVar(&allowedHosts, "allowed-host", nil, "extra Host header accepted (DNS-rebinding defence; repeatable)")
	f.IntVar(&pool, "pool", 2, "sandboxes kept started ahead (0 = none)")
	f.IntVar(&maxSessions, "max-sessions", 64, "sessions held at once")
	f.DurationVar(&idle, "idle-timeout", 30*time.Minute, "close a session unused this long")
	f.DurationVar(&lifetime, "max-lifetime", 12*time.Hour, "close a session this long after creation")
	f.DurationVar(&execTO, "exec-timeout", 5*time.Minute, "default execution timeout")
	f.BoolVar(&allowNetwork, "allow-network", false, "let sessions ask for the host's whole network (mode host)")
	f.StringVar(&defaultNetwork, "default-network", "none", "network mode of a session that asks for none: none or allow (with --allow's list)")
	f.StringSliceVar(&allow, "allow", nil, "allowlist of a session in mode allow that lists nothing (host names, *.domains, :PORTs, addresses, ranges, presets: "+strings.Join(egress.PresetNames(), ", ")+"; repeatable)")
	f.StringSliceVar(&allowMax, "allow-max", nil, "what sessions may list in mode allow (default: any host names, no addresses or ranges; repeatable)")
	f.StringVar(&wheelCache, "wheel-cache", "", "directory of the package cache shared by allow-mode sessions whose allowlist covers --pip-index (default DATA-DIR/wheel-cache; off: none)")
	f.Var(sizeValue{&wheelCacheSize}, "wheel-cache-size", "size cap of the package cache (least recently used files go first)")
	f.StringVar(&pipIndex, "pip-index", egress.DefaultIndex(), "PEP 503 index the package cache mirrors for pip in allow-mode sessions")
	f.BoolVar(&jsonLogs, "log-json", false, "log as JSON lines")
	registerZygote(f, &zygoteFlag)
	f.BoolVar(&useE2B, "e2b", true, "serve E2B's API too, so E2B's SDKs run against this server (prints what to export)")
	f.StringVar(&pricesFile, "prices", "", "JSON file overriding the model price table")
	f.StringVar(&gatewaySecretFile, "gateway-secret-file", "", "serve as a cell's host: accept only requests from gateways holding this file's secret (also SANDLOOP_GATEWAY_SECRET); see docs/kubernetes.md")
	f.StringVar(&register, "register", "", "register this host in the cell's PostgreSQL under this base URL (http://HOST:PORT, as gateways reach it), for gateways started with --registered-hosts; see docs/kubernetes.md")
	f.DurationVar(&heartbeat, "heartbeat", 2*time.Second, "with --register, how often the registration is renewed")
	f.DurationVar(&drainTimeout, "drain-timeout", 0, "on SIGTERM, first drain: take no new sessions (readiness false) and wait this long for the open ones to end")
	f.StringVar(&model, "model", "", "model for agent runs that name none, as PROVIDER/MODEL (default: $SANDLOOP_MODEL, else the first usable one found)")
	f.Var(sizeValue{&maxBody}, "max-body", "largest JSON request body (create a session, execute, lessons; default 4M): more is answered 413")
	f.Var(sizeValue{&maxUpload}, "max-upload", "largest file uploaded with PUT /v1/sessions/{id}/files/{path} (default 100M): more is answered 413")
	f.Var(sizeValue{&maxRunBody}, "max-run-body", "largest POST /v1/runs body, task and files included (default 32M): more is answered 413")
	f.Var(sizeValue{&def.memory}, "memory", "default memory limit per session (default 512M)")
	f.Float64Var(&def.cpus, "cpus", 0, "default CPU quota per session (default 1)")
	f.IntVar(&def.pids, "pids", 0, "default process limit per session (default 256)")
	def.registerQuota(f, "", "")
	f.Var(sizeValue{&max.memory}, "max-memory", "largest memory limit a session may ask for (default: --memory)")
	f.Float64Var(&max.cpus, "max-cpus", 0, "largest CPU quota a session may ask for (default: --cpus)")
	f.IntVar(&max.pids, "max-pids", 0, "largest process limit a session may ask for (default: --pids)")
	max.registerQuota(f, "max-", "largest")
	return cmd
}

// loadGatewaySecret reads the cell's shared secret from file or
// SANDLOOP_GATEWAY_SECRET; "" means not a cell's host (or gateway).
func loadGatewaySecret(file string) (string, error) {
	secret := os.Getenv("SANDLOOP_GATEWAY_SECRET")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--gateway-secret-file: %w", err)
		}
		secret = string(b)
	}
	secret = strings.TrimSpace(secret)
	if secret != "" && len(secret) < 32 {
		return "", fmt.Errorf("the gateway secret must be at least 32 characters long (e.g. openssl rand -hex 32)")
	}
	return secret, nil
}

// newEpoch names this process's life as a host.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// drain stops new sessions and waits, up to timeout or a second signal,
// until the open sessions have ended (deleted, reaped or idle-closed).
func drain(log *slog.Logger, srv *server.Server, mgr *session.Manager, timeout time.Duration) {
	srv.Drain()
	log.Info("draining: no new sessions", "open", mgr.Stats().Sessions, "timeout", timeout)
	again := make(chan os.Signal, 1)
	signal.Notify(again, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(again)
	deadline := time.After(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for mgr.Stats().Sessions > 0 {
		select {
		case <-deadline:
			log.Warn("drain timeout: closing the sessions left", "open", mgr.Stats().Sessions)
			return
		case <-again:
			return
		case <-tick.C:
		}
	}
	log.Info("drained")
}

// defaultModel makes resolve use model for runs that name none.
func defaultModel(model string, resolve func(context.Context, string) (llm.Provider, error)) func(context.Context, string) (llm.Provider, error) {
	return func(ctx context.Context, m string) (llm.Provider, error) {
		if m == "" {
			m = model
		}
		return resolve(ctx, m)
	}
}

// modelLine says which model agent runs will use, or how to configure one.
func modelLine(ctx context.Context, model, pricesFile string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := llm.Resolve(ctx, llm.Config{Model: model, PricesFile: pricesFile})
	if err != nil {
		return "agent runs: " + server.ModelProblem(err)
	}
	return "agent runs use " + p.Info().String()
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return d + "/sandloop"
	}
	if h, err := os.UserHomeDir(); err == nil {
		return h + "/.local/share/sandloop"
	}
	return ".sandloop"
}

func init() { extraCommands = append(extraCommands, newServeCmd) }
