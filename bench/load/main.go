// Command load is issue 4's proof under load: it starts a sandloop server
// in this process (real jails and kernels), has many clients execute code
// on their own sessions while others create and delete sessions, then
// shuts the server down and checks that no request failed and that no
// process, cgroup or workspace was left behind. It prints p50/p99/max
// latencies and exits 1 if any check fails.
//
//	go run ./bench/load -duration 2m -clients 50
//
// Issue 26's runs are other modes of it, with the same leak checks:
//
//	go run ./bench/load -mode sustain   # ≥100 creates/s for 30 s, old pipeline beside
//	go run ./bench/load -mode idle      # 2,000 idle pandas sessions: memory per session
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
	var sc SustainConfig
	var ic IdleConfig
	mode := flag.String("mode", "mixed", "mixed (clients executing while others create and delete), sustain (sustained creation, old pipeline beside) or idle (idle pandas sessions: memory per session)")
	flag.IntVar(&sc.Rate, "rate", 0, "sustain: creates offered per second (default 100)")
	flag.StringVar(&sc.CPUProfile, "cpuprofile", "", "sustain: write the new pipeline run's CPU profile (pprof) here")
	flag.StringVar(&sc.Trace, "trace", "", "sustain: write the new pipeline run's execution trace (runtime/trace) here")
	flag.DurationVar(&sc.OldDuration, "old-duration", 0, "sustain: the old pipeline's run, before the new one (default 10s; negative: none)")
	flag.IntVar(&ic.Sessions, "sessions", 0, "idle: sessions held at once (default 2000)")
	flag.DurationVar(&cfg.Duration, "duration", 0, "how long to load the server (default 2m)")
	flag.IntVar(&cfg.Clients, "clients", 0, "clients executing on their own session (default 50)")
	flag.IntVar(&cfg.Creators, "creators", 0, "goroutines creating, using once and deleting sessions (default 4)")
	flag.IntVar(&cfg.PoolSize, "pool", 0, "warm pool size (default 4)")
	flag.IntVar(&cfg.MaxSessions, "max-sessions", 0, "server's session cap (default clients+2, so creators meet 429s)")
	flag.Parse()
	cfg.Log = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch *mode {
	case "mixed":
	case "sustain", "idle":
		sc.Duration, sc.MaxSessions, sc.PoolSize, sc.Log = cfg.Duration, cfg.MaxSessions, cfg.PoolSize, cfg.Log
		ic.MaxSessions, ic.PoolSize, ic.Log = cfg.MaxSessions, cfg.PoolSize, cfg.Log
		var problems []string
		var err error
		if *mode == "sustain" {
			problems, err = Sustain(ctx, sc, os.Stdout)
		} else {
			problems, err = Idle(ctx, ic, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(2)
		}
		if len(problems) > 0 {
			fmt.Printf("FAILED: %v\n", problems)
			os.Exit(1)
		}
		fmt.Println("PASSED: no failure, nothing left behind")
		return
	default:
		fmt.Fprintf(os.Stderr, "load: -mode %q: want mixed, sustain or idle\n", *mode)
		os.Exit(2)
	}
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
