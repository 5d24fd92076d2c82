package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/gateway"
	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/webui"
	"github.com/spf13/cobra"
)

func newGatewayCmd() *cobra.Command {
	var (
		addr, database, tokenFile, secretFile string
		hostList, kubeService, kubePort       string
		tokens, allowedHosts, portDomains     []string
		healthEvery, lostAfter, drainTimeout  time.Duration
		registered                            bool
		heartbeatDeadline                     time.Duration
		retention, maxLifetime                time.Duration
		jsonLogs                              bool
	)
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Serve the API of a cell: many `sandloop serve` hosts behind one endpoint (docs/kubernetes.md)",
		Long: `Serve the same HTTP API, MCP endpoint and web UI as 'sandloop serve', backed
by many hosts: each new session goes to the better of two ready hosts by free
slots, and every request of it is proxied to its host. Where sessions live is
kept in PostgreSQL (--database), shared by every gateway replica. Hosts run
'sandloop serve --gateway-secret-file F' with the same secret, and are found
by --hosts (a static list), --kube-service (a headless Service's
EndpointSlices, from inside Kubernetes) or --registered-hosts (hosts started
with 'serve --register URL' keep a heartbeat in the database). GET /v1/hosts
shows them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			toks, err := server.LoadTokens(tokens, tokenFile)
			if err != nil {
				return usagef("%v", err)
			}
			if err := server.CheckBind(addr, toks); err != nil {
				return usagef("%v", err)
			}
			secret, err := loadGatewaySecret(secretFile)
			if err != nil {
				return usagef("%v", err)
			}
			if secret == "" {
				return usagef("a gateway needs the cell's shared secret: --gateway-secret-file or SANDLOOP_GATEWAY_SECRET")
			}
			if database == "" {
				database = os.Getenv("SANDLOOP_DATABASE_URL")
			}
			if !store.IsPostgresURL(database) {
				return usagef("a gateway needs PostgreSQL: --database postgres://USER:PASSWORD@HOST/DB (or SANDLOOP_DATABASE_URL)")
			}
			if n := btoi(hostList != "") + btoi(kubeService != "") + btoi(registered); n != 1 {
				return usagef("give the hosts by exactly one of --hosts URL,URL,..., --kube-service NAME and --registered-hosts")
			}
			log := newLogger(cmd.ErrOrStderr(), jsonLogs)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			pg, err := store.OpenPostgres(ctx, database, &store.Options{Logger: log})
			if err != nil {
				return err
			}
			defer pg.Close()
			// The loops (discovery, health, notifications) stop and are
			// waited for before PostgreSQL closes (deferred above, so run after).
			runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
			var loops sync.WaitGroup
			defer loops.Wait()
			defer cancelRun()
			var disc gateway.Discovery
			switch {
			case hostList != "":
				if disc, err = gateway.ParseStatic(hostList); err != nil {
					return usagef("%v", err)
				}
			case kubeService != "":
				if disc, err = gateway.InCluster(runCtx, kubeService, kubePort); errors.Is(err, gateway.ErrNoNamespace) {
					return usagef("--kube-service %v", err)
				} else if err != nil {
					return fmt.Errorf("--kube-service: %w", err)
				}
			default:
				reg := gateway.NewRegistered(pg, heartbeatDeadline, log)
				if err := reg.Refresh(ctx); err != nil {
					return err
				}
				loops.Go(func() { reg.Run(runCtx, healthEvery) })
				disc = reg
			}
			gw, err := gateway.New(&gateway.Options{
				Discovery: disc, Cluster: pg, Secret: secret, Tokens: toks, AllowedHosts: allowedHosts,
				PublicMounts: webui.Mounts(), HealthInterval: healthEvery, LostAfter: lostAfter, Logger: log,
				Retention: retention, MaxLifetime: maxLifetime, PortDomains: portDomains,
			})

			if err != nil {
				return err
			}
			loops.Go(func() { gw.Run(runCtx) })
			gw.Refresh(ctx)
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return usagef("cannot listen on %s: %v", addr, err)
			}
			hs := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			fmt.Fprintf(cmd.OutOrStdout(), "sandloop gateway on http://%s (%d hosts listed)\n", ln.Addr(), len(disc.Targets()))
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			// Unready first, then let in-flight requests and streams finish.
			gw.Drain()
			log.Info("draining: letting in-flight requests finish", "timeout", drainTimeout)
			sctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				log.Warn("shutdown", "err", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "127.0.0.1:8080", "address to listen on (HOST:PORT)")
	f.StringVar(&database, "database", "", "the cell's PostgreSQL: postgres://USER:PASSWORD@HOST/DB (also SANDLOOP_DATABASE_URL)")
	f.StringVar(&hostList, "hosts", "", "the hosts' base URLs, comma-separated (without Kubernetes)")
	f.StringVar(&kubeService, "kube-service", "", "find the hosts through this headless Service's EndpointSlices (in the pod's namespace, or NAMESPACE/NAME)")
	f.StringVar(&kubePort, "kube-port", "http", "the Service port to dial (its name)")
	f.BoolVar(&registered, "registered-hosts", false, "find the hosts by their heartbeats in --database (hosts started with serve --register URL; without Kubernetes or a fixed list)")
	f.DurationVar(&heartbeatDeadline, "heartbeat-deadline", 10*time.Second, "with --registered-hosts, a host whose last heartbeat is older is no longer listed")
	f.DurationVar(&retention, "retention", 24*time.Hour, "rows of lost or closed sessions and of hosts not seen are deleted this long after (410 until then, 404 after)")
	f.DurationVar(&maxLifetime, "max-lifetime", 12*time.Hour, "the hosts' --max-lifetime: an older session's row is deleted --retention later")
	f.StringVar(&secretFile, "gateway-secret-file", "", "file holding the cell's shared secret (also SANDLOOP_GATEWAY_SECRET)")
	f.StringArrayVar(&tokens, "token", nil, "accepted bearer token (repeatable; also SANDLOOP_TOKEN)")
	f.StringVar(&tokenFile, "token-file", "", "file with accepted tokens, one per line")
	f.StringArrayVar(&allowedHosts, "allowed-host", nil, "extra Host header accepted (DNS-rebinding defence; repeatable)")
	f.DurationVar(&healthEvery, "health-interval", time.Second, "how often every host is asked for its health")
	f.DurationVar(&lostAfter, "lost-after", 10*time.Second, "a host that does not answer this long is lost: its sessions answer 410")
	f.DurationVar(&drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long in-flight requests and streams may take to finish")
	f.StringArrayVar(&portDomains, "port-domain", nil, "wildcard domain whose names PORT-ID.DOMAIN reach a session's port (DNS points *.DOMAIN at the gateways; repeatable; the first names the URLs handed out; PORT-ID.localhost always works)")
	f.BoolVar(&jsonLogs, "log-json", false, "log as JSON lines")
	return cmd
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
