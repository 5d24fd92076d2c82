package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	neturl "net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/llm"
	"github.com/sandloop/sandloop/internal/runs"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveFlags are serve's flags: most are host.Config's fields as they are.
type serveFlags struct {
	cfg                                   host.Config
	addr, tokenFile, secretFile, register string
	database                              string
	tokens, allow, allowMax               []string
	def, max                              limitFlags
	defaultNetwork, wheelCache, pipIndex  string
	wheelCacheSize                        int64
	zygote                                zygoteMode
	jsonLogs                              bool
	drainTimeout                          time.Duration
	e2bTrace                              string
}

func newServeCmd() *cobra.Command {
	sf := &serveFlags{wheelCacheSize: egress.DefaultCacheBytes}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the HTTP API (sessions, files, metrics) with a warm pool of sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := sf.config(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", sf.addr)
			if err != nil {
				return usagef("cannot listen on %s: %v", sf.addr, err)
			}
			h, err := host.New(cmd.Context(), ln, cfg)
			if err != nil {
				ln.Close()
				return hostError(err)
			}
			defer h.Close()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			printServing(cmd.OutOrStdout(), h, cfg.Tokens, cfg.GatewaySecret != "")
			fmt.Fprintln(cmd.OutOrStdout(), modelLine(ctx, cfg.Model, cfg.PricesFile))
			if r := jail.Probe(); !r.Cgroups.OK {
				cfg.Logger.Warn("cgroups unavailable: limits fall back to rlimits", "detail", r.Cgroups.Detail)
			}
			if err := h.Serve(ctx); err != nil {
				return err
			}
			if sf.drainTimeout > 0 && !cfg.KeepSessions { // kept sessions are not waited for: they stay
				again, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
				h.Drain(again, sf.drainTimeout) // a second signal ends the drain
				stop()
			}
			return h.Close()
		},
	}
	sf.flags(cmd.Flags())
	return cmd
}

func (sf *serveFlags) flags(f *pflag.FlagSet) {
	c := &sf.cfg
	f.StringVar(&sf.addr, "addr", "127.0.0.1:8080", "address to listen on (HOST:PORT)")
	f.StringVar(&c.DataDir, "data-dir", defaultDataDir(), "where run history is kept")
	f.StringVar(&sf.database, "database", "", databaseHelp)
	f.StringArrayVar(&sf.tokens, "token", nil, "accepted bearer token (repeatable; also SANDLOOP_TOKEN)")
	f.StringVar(&sf.tokenFile, "token-file", "", "file with accepted tokens, one per line")
	f.StringArrayVar(&c.AllowedHosts, "allowed-host", nil, "extra Host header accepted (DNS-rebinding defence; repeatable)")
	f.IntVar(&c.PoolSize, "pool", 2, "sandboxes kept started ahead (0 = none)")
	f.IntVar(&c.MaxSessions, "max-sessions", 64, "sessions held at once")
	f.Var(sizeValue{n: &c.SpareMemory}, "spare-memory", "memory the sandboxes kept ready ahead may hold when bursts grow the pool past --pool (the pool remembers the largest burst of the last 5 minutes), at ~8 MiB each forked (48 MiB cold) (default: an eighth of the memory available at start)")
	// The pipeline before issue 26, for benchmarks' baselines only.
	f.BoolVar(&c.OldPipeline, "old-pipeline", false, "")
	_ = f.MarkHidden("old-pipeline")
	// E2B commands that join when they come, and a file of their stages
	// (BenchmarkE2BFirstCommand): for benchmarks only.
	f.BoolVar(&c.ColdCommands, "cold-commands", false, "")
	_ = f.MarkHidden("cold-commands")
	f.StringVar(&sf.e2bTrace, "e2b-command-trace", "", "")
	_ = f.MarkHidden("e2b-command-trace")
	f.DurationVar(&c.IdleTimeout, "idle-timeout", 30*time.Minute, "close (or, with --idle-action pause, pause) a session unused this long")
	f.StringVar(&c.IdleAction, "idle-action", "close", "what becomes of a session idle past --idle-timeout: close, or pause (it keeps its state and memory, uses no CPU, takes no slot of --max-sessions; the next request resumes it)")
	f.DurationVar(&c.IdleHibernate, "idle-hibernate", 0, "hibernate a session idle (or paused) this long: its files and variables go to the snapshot store, its processes and workspace are freed, and the next request restores it on the same id (0 = never)")
	f.StringVar(&c.SnapshotStore, "snapshot-store", "", "where snapshots are kept: a directory, or s3://[ACCESS:SECRET@]HOST[:PORT]/BUCKET[/PREFIX][?insecure=1] (keys also from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); off for none (default DATA-DIR/snapshots)")
	f.DurationVar(&c.SnapshotEvery, "snapshot-every", 0, "snapshot a session used since its last snapshot at most this often (its files exactly, its variables as far as they serialize; only what changed is stored), so a session whose processes are lost (its keeper or this server killed) comes back from it on the next start (default 30s with --keep-sessions, else off; negative = off)")
	f.Var(sizeValue{n: &c.SnapshotQuota}, "snapshot-quota", "stored bytes (compressed, deduplicated) one token's snapshots may hold; a snapshot over it is refused with 413 (default: no cap)")
	f.DurationVar(&c.SnapshotTTL, "snapshot-ttl", 30*24*time.Hour, "delete snapshots older than this (0 = keep them; hibernated sessions' are kept while they sleep)")
	f.IntVar(&c.SnapshotsPerSession, "snapshots-per-session", 0, "keep only the newest this many snapshots of one session (0 = all)")
	f.DurationVar(&c.MaxLifetime, "max-lifetime", 12*time.Hour, "close a session this long after creation")
	f.DurationVar(&c.PreviewFor, "preview-for", runs.DefaultPreviewFor, "keep an app run's sandbox this long after the run while a server its agent started listens, so its preview URL opens the app (closed earlier by POST /v1/runs/ID/cancel, or at --max-lifetime)")
	f.StringVar(&c.Checkpoints, "checkpoints", "off", `checkpoints of a session that asks for none: off, or auto (one before every execution, so POST /v1/sessions/{id}/undo reverts the last cell)`)
	f.IntVar(&c.AutoCheckpoints, "auto-checkpoints", session.DefaultAutoCheckpoints, "automatic checkpoints kept per session (checkpoints auto)")
	f.IntVar(&c.MaxCheckpoints, "max-checkpoints", session.DefaultMaxCheckpoints, "checkpoints a session may take on request")
	f.Var(sizeValue{n: &c.CheckpointMemory}, "checkpoint-memory", "memory and files a session's checkpoints may hold (default 1G): over it the oldest automatic ones are dropped")
	f.DurationVar(&c.ExecTimeout, "exec-timeout", 5*time.Minute, "default execution timeout")
	f.BoolVar(&c.AllowNetwork, "allow-network", false, "let sessions ask for the host's whole network (mode host)")
	f.StringVar(&sf.defaultNetwork, "default-network", "none", "network mode of a session that asks for none: none or allow (with --allow's list)")
	f.StringSliceVar(&sf.allow, "allow", nil, "allowlist of a session in mode allow that lists nothing (host names, *.domains, :PORTs, addresses, ranges, presets: "+strings.Join(egress.PresetNames(), ", ")+"; repeatable)")
	f.StringSliceVar(&sf.allowMax, "allow-max", nil, "what sessions may list in mode allow (default: any host names, no addresses or ranges; repeatable)")
	f.StringVar(&sf.wheelCache, "wheel-cache", "", "directory of the package cache shared by allow-mode sessions whose allowlist covers --pip-index (default DATA-DIR/wheel-cache; off: none)")
	f.Var(sizeValue{n: &sf.wheelCacheSize}, "wheel-cache-size", "size cap of the package cache (least recently used files go first)")
	f.StringVar(&sf.pipIndex, "pip-index", egress.DefaultIndex(), "PEP 503 index the package cache mirrors for pip in allow-mode sessions")
	f.BoolVar(&sf.jsonLogs, "log-json", false, "log as JSON lines")
	registerZygote(f, &sf.zygote)
	registerTemplateServeFlags(f, c)
	f.BoolVar(&c.E2B, "e2b", true, "serve E2B's API too, so E2B's SDKs run against this server (prints what to export)")
	f.StringVar(&c.PricesFile, "prices", "", "JSON file overriding the model price table")
	f.StringVar(&sf.secretFile, "gateway-secret-file", "", "serve as a cell's host: accept only requests from gateways holding this file's secret (also SANDLOOP_GATEWAY_SECRET); see docs/kubernetes.md")
	f.StringVar(&sf.register, "register", "", "register this host in the cell's PostgreSQL under this base URL (http://HOST:PORT, as gateways reach it), for gateways started with --registered-hosts; see docs/kubernetes.md")
	f.DurationVar(&c.Heartbeat, "heartbeat", 2*time.Second, "with --register, how often the registration is renewed")
	f.BoolVar(&c.KeepSessions, "keep-sessions", false, "keep sessions alive across restarts of the server (kill -9, upgrades): a keeper process per --data-dir holds their sandboxes, and the next serve on the same --data-dir takes them over; on SIGTERM sessions are left to it, not closed. Needs root; sessions start cold (no zygote)")
	f.DurationVar(&sf.drainTimeout, "drain-timeout", 0, "on SIGTERM, first drain: take no new sessions (readiness false) and wait this long for the open ones to end")
	f.StringVar(&c.Model, "model", "", "model for agent runs that name none, as PROVIDER/MODEL (default: $SANDLOOP_MODEL, else the first usable one found)")
	f.Var(sizeValue{n: &c.MaxBodyBytes}, "max-body", "largest JSON request body (create a session, execute, lessons; default 4M): more is answered 413")
	f.Var(sizeValue{n: &c.MaxFileBytes}, "max-upload", "largest file uploaded with PUT /v1/sessions/{id}/files/{path} (default 100M): more is answered 413")
	f.Var(sizeValue{n: &c.MaxRunBodyBytes}, "max-run-body", "largest POST /v1/runs body, task and files included (default 32M): more is answered 413")
	f.Var(sizeValue{n: &sf.def.memory, limit: true}, "memory", "default memory limit per session (default 512M)")
	f.Float64Var(&sf.def.cpus, "cpus", 0, "default CPU quota per session (default 1)")
	f.IntVar(&sf.def.pids, "pids", 0, "default process limit per session (default 256)")
	sf.def.registerQuota(f, "", "")
	f.Var(sizeValue{n: &sf.max.memory, limit: true}, "max-memory", "largest memory limit a session may ask for (default: --memory)")
	f.Float64Var(&sf.max.cpus, "max-cpus", 0, "largest CPU quota a session may ask for (default: --cpus)")
	f.IntVar(&sf.max.pids, "max-pids", 0, "largest process limit a session may ask for (default: --pids)")
	sf.max.registerQuota(f, "max-", "largest")
}

// config turns the flags into the host's Config, or says what to fix.
func (sf *serveFlags) config(logTo io.Writer) (*host.Config, error) {
	cfg := sf.cfg
	cfg.Database = cmp.Or(sf.database, os.Getenv("SANDLOOP_DATABASE_URL"))
	cfg.Zygote, cfg.MCP, cfg.Logger = sf.zygote.v, mcpHandler, newLogger(logTo, sf.jsonLogs)
	toks, err := server.LoadTokens(sf.tokens, sf.tokenFile)
	if err != nil {
		return nil, usagef("%v", err)
	}
	if sf.e2bTrace != "" {
		f, err := os.OpenFile(sf.e2bTrace, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, usagef("--e2b-command-trace: %v", err)
		}
		cfg.E2BCommandTrace = f // open while the server runs
	}
	secret, err := loadGatewaySecret(sf.secretFile)
	if err != nil {
		return nil, usagef("%v", err)
	}
	// A cell's host needs no token on other interfaces: the secret guards it.
	if err := server.CheckBind(sf.addr, append(slices.Clone(toks), secret)); err != nil {
		return nil, usagef("%v", err)
	}
	cfg.Tokens, cfg.GatewaySecret = toks, secret
	if secret != "" {
		// A cell's host answers only its gateways, which do not serve
		// E2B's API (yet): its E2B face could not be reached.
		cfg.E2B = false
	}
	if sf.register != "" {
		self, err := gateway.ParseHostURL(sf.register)
		if err != nil {
			return nil, usagef("--register: %v", err)
		}
		if secret == "" || !store.IsPostgresURL(cfg.Database) {
			return nil, usagef("--register makes this a cell's host: it needs --gateway-secret-file and --database postgres://...")
		}
		cfg.Register = &self
	}
	if cfg.Defaults, err = sf.def.limits(); err != nil {
		return nil, err
	}
	if cfg.Max, err = sf.max.limits(); err != nil {
		return nil, err
	}
	if err := checkDiskFits("--max-", cfg.Max, cfg.Defaults); err != nil {
		return nil, err
	}
	sf.def.sayNotes(logTo)
	sf.max.sayNotes(logTo)
	if cfg.Egress, err = egressOptions(sf.defaultNetwork, sf.allow, sf.allowMax); err != nil {
		return nil, err
	}
	if cfg.PoolSize < 0 || cfg.MaxSessions < 0 {
		return nil, usagef("--pool and --max-sessions must not be negative")
	}
	if err := session.CheckIdleAction(cfg.IdleAction); err != nil {
		return nil, usagef("--idle-action: %v", err)
	}
	if cfg.Checkpoints != session.CheckpointsOff && cfg.Checkpoints != session.CheckpointsAuto {
		return nil, usagef("--checkpoints %q: use off or auto", cfg.Checkpoints)
	}
	if cfg.AutoCheckpoints < 1 || cfg.MaxCheckpoints < 1 || cfg.CheckpointMemory < 0 {
		return nil, usagef("--auto-checkpoints, --max-checkpoints and --checkpoint-memory must be at least 1 (use --checkpoints off for none)")
	}
	if cfg.IdleHibernate < 0 || cfg.SnapshotTTL < 0 || cfg.SnapshotsPerSession < 0 || cfg.SnapshotQuota < 0 {
		return nil, usagef("--idle-hibernate, --snapshot-ttl, --snapshots-per-session and --snapshot-quota must not be negative (0 turns each off)")
	}
	if cfg.IdleHibernate > 0 && cfg.IdleTimeout > 0 && cfg.IdleHibernate >= cfg.IdleTimeout {
		return nil, usagef("--idle-hibernate %v must be shorter than --idle-timeout %v: a session idle past --idle-timeout is closed before it could hibernate", cfg.IdleHibernate, cfg.IdleTimeout)
	}
	if cfg.MaxSessions == 0 {
		return nil, usagef("--max-sessions 0 is not a limit: give the number of sessions held at once, at least 1 (default 64)")
	}
	if cfg.PoolSize > cfg.MaxSessions {
		return nil, usagef("--pool %d is more than --max-sessions %d: the sandboxes kept ready are for sessions to come, and at most --max-sessions are held at once; raise --max-sessions or lower --pool", cfg.PoolSize, cfg.MaxSessions)
	}
	if cfg.WheelCache, err = openWheelCache(sf.wheelCache, cfg.DataDir, sf.wheelCacheSize, sf.pipIndex, cfg.Logger); err != nil {
		return nil, err
	}
	if cfg.Database == "" {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, usagef("--data-dir %s: %v", cfg.DataDir, unwrapPathError(err))
		}
	}
	return &cfg, nil
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

// hostError words host's argument errors as flags.
func hostError(err error) error {
	var ae *host.ArgumentError
	if errors.As(err, &ae) {
		return usagef("--%s %v", ae.Name, ae.Err)
	}
	return err
}

// printServing says where the host serves and what to export for E2B's SDKs.
func printServing(w io.Writer, h *host.Host, tokens []string, cellHost bool) {
	url := h.URL()
	if cellHost {
		fmt.Fprintf(w, "sandloop cell host on %s (only its gateways reach it: every request but /healthz, /readyz and /metrics needs the cell's secret)\n", url)
		return
	}
	if len(tokens) > 0 {
		fmt.Fprintf(w, "sandloop serving on %s (token required)\n", url)
		fmt.Fprintf(w, "web UI: %s/?token=%s\n", url, neturl.QueryEscape(tokens[0]))
	} else {
		fmt.Fprintf(w, "sandloop serving on %s\n", url)
		fmt.Fprintf(w, "web UI: %s/\n", url)
	}
	if k := h.E2BKey(); k != "" {
		fmt.Fprintf(w, "E2B SDKs: export E2B_API_URL=%s E2B_SANDBOX_URL=%s E2B_API_KEY=%s\n", url, url, k)
	}
}

// newLogger is the log of the serving commands: text on w, or JSON lines.
func newLogger(w io.Writer, jsonLines bool) *slog.Logger {
	if jsonLines {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
