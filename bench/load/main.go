// Command load is issue 4's proof under load: it starts a sandloop server
// in this process (real jails and kernels), has many clients execute code
// on their own sessions while others create and delete sessions, then
// shuts the server down and checks that no request failed and that no
// process, cgroup or workspace was left behind. It prints p50/p99/max
// latencies and exits 1 if any check fails.
//
//	go run ./bench/load -duration 2m -clients 50
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/sandloop/sandloop/internal/jail"
)

func main() {
	jail.MaybeInit() // the jail re-executes this binary as its init
	var cfg Config
	flag.DurationVar(&cfg.Duration, "duration", 0, "how long to load the server (default 2m)")
	flag.IntVar(&cfg.Clients, "clients", 0, "clients executing on their own session (default 50)")
	flag.IntVar(&cfg.Creators, "creators", 0, "goroutines creating, using once and deleting sessions (default 4)")
	flag.IntVar(&cfg.PoolSize, "pool", 0, "warm pool size (default 4)")
	flag.IntVar(&cfg.MaxSessions, "max-sessions", 0, "server's session cap (default clients+2, so creators meet 429s)")
	flag.Parse()
	cfg.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	rep.Print(os.Stdout)
	if p := rep.Problems(); len(p) > 0 {
		fmt.Printf("FAILED: %v\n", p)
		os.Exit(1)
	}
	fmt.Println("PASSED: no failed request, nothing left behind")
}
