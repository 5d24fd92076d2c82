package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/sandloop/sandloop/internal/host"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/zygote"
	"github.com/spf13/pflag"
)

// zygoteMode is the --zygote flag of serve, mcp and agent: "auto" (the
// default) forks sessions from a template kernel that has imported numpy,
// pandas and matplotlib wherever the host can run one, and starts them
// cold otherwise; "on" makes a host that cannot a startup error; "off"
// always starts sessions cold.
type zygoteMode struct{ v string }

func (m *zygoteMode) String() string { return m.v }
func (m *zygoteMode) Type() string   { return "auto|on|off" }
func (m *zygoteMode) Set(v string) error {
	switch strings.ToLower(v) {
	case "auto":
		m.v = "auto"
	case "on", "true", "1":
		m.v = "on"
	case "off", "false", "0":
		m.v = "off"
	default:
		return fmt.Errorf("%q is not auto, on or off", v)
	}
	return nil
}

func registerZygote(fs *pflag.FlagSet, m *zygoteMode) {
	m.v = "auto"
	fs.Var(m, "zygote", "fork sessions from a template kernel with numpy, pandas and matplotlib imported: auto (where the host can: cgroups, delegated ones without root), on (fail if it cannot), off")
	fs.Lookup("zygote").NoOptDefVal = "on"
}

// check refuses "on" on a host that cannot run the zygote, before anything
// starts.
func (m zygoteMode) check() error {
	if m.v == "on" {
		if err := zygote.Supported(); err != nil {
			return usagef("--zygote cannot work on this host: %s", host.UnsupportedReason(err))
		}
	}
	return nil
}

// startZygote starts the zygote m asks for. It returns nil, and sessions
// start cold, for "off", or for "auto" on a host that cannot run one
// (logged in one line with the reason); for "on" there, a usage error.
func startZygote(ctx context.Context, m zygoteMode, log *slog.Logger) (*zygote.Zygote, error) {
	z, err := host.StartZygote(ctx, m.v, log)
	return z, hostError(err)
}

// zygoteLater starts the zygote in the background, for commands whose
// first session comes later (mcp, agent): Get waits for it.
type zygoteLater struct {
	done chan struct{}
	z    *zygote.Zygote
	err  error
}

// A host that cannot run the zygote the user asked for (on) is an error
// at once.
func startZygoteLater(ctx context.Context, m zygoteMode, log *slog.Logger) (*zygoteLater, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	l := &zygoteLater{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.z, l.err = startZygote(context.WithoutCancel(ctx), m, log)
	}()
	return l, nil
}

// Get returns the zygote (nil: sessions start cold), waiting for its start.
func (l *zygoteLater) Get(ctx context.Context) (session.Zygote, error) {
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if l.err != nil || l.z == nil {
		return nil, l.err
	}
	return l.z, nil
}

// Close stops the zygote once it has started.
func (l *zygoteLater) Close() {
	<-l.done
	if l.z != nil {
		l.z.Close()
	}
}
