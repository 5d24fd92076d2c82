package main

import (
	"context"
	"fmt"
	"io"
	"strings"

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
	g := egress.New(egress.Options{Policy: *pol})
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
		if !e.Allowed {
			verdict = "refused"
		}
		line := fmt.Sprintf("sandloop: network: %s %s %s %s:%d, %d bytes out, %d in", e.Time.Format("15:04:05"), verdict, e.Method, e.Host, e.Port, e.BytesOut, e.BytesIn)
		if e.Reason != "" {
			line += " (" + e.Reason + ")"
		}
		fmt.Fprintln(w, line)
	}
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
