package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/mcpserver"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/tools"
	"github.com/spf13/cobra"
)

func newMCPCmd() *cobra.Command {
	var (
		lf                          limitFlags
		maxTimeout                  time.Duration
		maxOutput, maxText, maxCode int64
		maxFile, maxWorkspace       int64
		tools                       []string
		verbose                     bool
		zygoteFlag                  zygoteMode
		tc                          templateChoice
	)
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve MCP tools (execute_python, run_shell, files) on stdin/stdout",
		Long: `Serve the Model Context Protocol on stdin/stdout, for MCP clients that
start sandloop themselves (Claude Desktop, Cursor, VS Code...). The connection
gets one sandboxed, stateful Python session, started on the first tool call
and closed when the client disconnects. Logs go to stderr.

Tools: ` + strings.Join(mcpserver.ToolNames, ", ") + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			limits, err := lf.limits()
			if err != nil {
				return err
			}
			pol, err := lf.egressPolicy()
			if err != nil {
				return err
			}
			if u, err := tc.use(cmd.Context()); err != nil { // said at once, not at the first tool call
				return err
			} else if u != nil {
				u.Release()
			}
			lf.sayNotes(cmd.ErrOrStderr())
			effMax := maxTimeout
			if effMax == 0 {
				effMax = 10 * time.Minute // mcpserver's default
			}
			switch {
			case maxTimeout < 0:
				return usagef("--max-timeout must not be negative")
			case lf.timeout > effMax:
				return usagef("--timeout %s is longer than --max-timeout %s", lf.timeout, effMax)
			case maxOutput > 1<<30:
				return usagef("--max-output must be at most 1G")
			case maxText > 1<<30 || maxCode > 1<<30:
				return usagef("--max-text and --max-code must be at most 1G")
			}
			env := map[string]string{}
			for _, kv := range lf.env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			sessOpts := session.Options{
				Checkpoints:    session.CheckpointsAuto, // for the undo tool
				Limits:         limits,
				Network:        lf.networkMode(),
				Egress:         pol,
				Env:            env,
				MaxOutputBytes: int(maxOutput),
				Logger:         log,
			}
			if tc.name != "" {
				zygoteFlag = zygoteMode{"off"} // the template's session starts cold
			}
			zl, err := startZygoteLater(cmd.Context(), zygoteFlag, log)
			if err != nil {
				return err
			}
			defer zl.Close() // after the server has closed its sessions
			src := mcpserver.SessionSourceFunc(func(ctx context.Context) (mcpserver.Session, error) {
				opts := sessOpts
				zy, err := zl.Get(ctx)
				if err != nil {
					return nil, err
				}
				opts.Zygote = zy
				if opts.Template, err = tc.use(ctx); err != nil {
					return nil, err
				}
				s, err := session.New(ctx, &opts)
				if err != nil {
					if opts.Template != nil {
						opts.Template.Release()
					}
					return nil, err
				}
				return s, nil
			})
			srv, err := mcpserver.New(src, &mcpserver.Options{
				Version:           version(),
				Tools:             tools,
				DefaultTimeout:    lf.timeout,
				MaxTimeout:        maxTimeout,
				MaxCodeBytes:      int(maxCode),
				MaxTextBytes:      int(maxText),
				MaxFileBytes:      maxFile,
				MaxWorkspaceBytes: maxWorkspace,
				Network:           lf.network,
				Allow:             pol.AllowEntries(),
				Logger:            log,
			})
			if err != nil {
				return usagef("--tools: %v", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err = srv.Run(ctx, &mcpserver.LineTransport{Reader: readCloser(cmd.InOrStdin()), Writer: cmd.OutOrStdout()})
			if cerr := srv.Close(); cerr != nil {
				log.Warn("close sessions", "err", cerr)
			}
			if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
				return nil // the client hung up or we were told to stop
			}
			return err
		},
	}
	f := cmd.Flags()
	lf.register(f)
	registerZygote(f, &zygoteFlag)
	tc.register(f)
	f.Lookup("timeout").Usage = "default timeout of one tool call when it gives no timeout_s (default 30s)"
	f.DurationVar(&maxTimeout, "max-timeout", 0, "largest timeout_s a tool call may ask for (default 10m)")
	f.Var(sizeValue{n: &maxOutput}, "max-output", "stdout and stderr kept per execution, each; the middle is dropped (default 1M)")
	f.Var(sizeValue{n: &maxText}, "max-text", "stdout, stderr and traceback shown to the model per call, each; head and tail kept (default 16K)")
	f.Var(sizeValue{n: &maxCode}, "max-code", "largest code execute_python accepts (default 1M)")
	f.Var(sizeValue{n: &maxFile}, "max-file", "largest file read_file or write_file handles (default 4M)")
	f.Var(sizeValue{n: &maxWorkspace}, "max-workspace", "largest total size of the workspace after write_file (default 1G)")
	f.StringSliceVar(&tools, "tools", nil, "comma-separated tools to offer (default all: "+strings.Join(mcpserver.ToolNames, ",")+")")
	f.BoolVarP(&verbose, "verbose", "v", false, "log debug details to stderr")
	return cmd
}

// readCloser lets the SDK close stdin when the connection ends, which
// unblocks its reader; other readers (tests) get a no-op Close.
func readCloser(r io.Reader) io.ReadCloser {
	if rc, ok := r.(io.ReadCloser); ok {
		return rc
	}
	return io.NopCloser(r)
}

// mcpHandler serves the MCP tools at /mcp on `sandloop serve`, each MCP
// session with its own session from the server's manager.
func mcpHandler(m *session.Manager) (http.Handler, error) {
	// The server checks Host headers for every path (with --allowed-host).
	return mcpserver.NewHTTPHandler(managerSource{m}, &mcpserver.Options{HostChecked: true, Version: version()})
}

// managerSource makes MCP sessions in the server's manager, so they count
// against --max-sessions, come from the warm pool and are reaped when idle.
type managerSource struct{ m *session.Manager }

// mcpOwner owns the manager's MCP sessions: the HTTP API's owners (tokens)
// do not see them.
const mcpOwner = "mcp"

// NewSession creates an MCP session in the manager; closing it gives it
// back (the manager marks it in use around every call, so it is reaped
// only when idle).
func (s managerSource) NewSession(ctx context.Context) (mcpserver.Session, error) {
	// Automatic checkpoints, for the undo tool.
	return s.m.Create(ctx, session.CreateOptions{Owner: mcpOwner, Checkpoints: session.CheckpointsAuto})
}

// KeepsSnapshots says whether the server has a snapshot store.
func (s managerSource) KeepsSnapshots() bool { return s.m.Snapshots() != nil }

// Snapshot writes an MCP session to the snapshot store, for the snapshot
// tool.
func (s managerSource) Snapshot(ctx context.Context, sess mcpserver.Session, name string) (*tools.Snapshot, error) {
	ms, ok := sess.(*session.Managed)
	if !ok {
		return nil, fmt.Errorf("snapshot: not a session of this server")
	}
	m, err := s.m.Snapshot(ctx, ms.Owner, ms.ID(), name)
	if err != nil {
		return nil, err
	}
	out := &tools.Snapshot{ID: m.ID, Bytes: m.TotalBytes, NewBytes: m.NewBytes}
	for _, f := range m.Files {
		if f.Type == "file" {
			out.Files++
		}
	}
	if m.State != nil {
		var sm kernel.StateManifest
		if json.Unmarshal(m.State.Manifest, &sm) == nil {
			out.Variables = sm.Variables
			for _, n := range sm.NotSaved {
				out.NotSaved = append(out.NotSaved, n.Name+": "+n.Reason)
			}
		}
	}
	return out, nil
}

// FromSnapshot starts an MCP session from a snapshot, for the snapshot
// tool's restore.
func (s managerSource) FromSnapshot(ctx context.Context, id string) (mcpserver.Session, *tools.Restored, error) {
	ms, err := s.m.Create(ctx, session.CreateOptions{Owner: mcpOwner, Checkpoints: session.CheckpointsAuto, Snapshot: id})
	if err != nil {
		return nil, nil, err
	}
	r := ms.Restored()
	tr := &tools.Restored{From: "snapshot " + id}
	if r != nil {
		tr = &tools.Restored{From: r.From, Files: r.Files, Variables: r.Variables, NotRestored: r.NotRestored, ExecutionCount: r.ExecutionCount}
	}
	return ms, tr, nil
}

// Fork copies an MCP session into a new one of the manager, for
// fork_session.
func (s managerSource) Fork(ctx context.Context, parent mcpserver.Session) (mcpserver.Session, *tools.Restored, error) {
	ms, ok := parent.(*session.Managed)
	if !ok {
		return nil, nil, fmt.Errorf("fork: not a session of this server")
	}
	kids, r, err := s.m.Fork(ctx, ms.Owner, ms.ID(), session.ForkOptions{Count: 1})
	if err != nil {
		return nil, nil, err
	}
	tr := &tools.Restored{From: "fork of " + ms.ID()}
	if r != nil {
		tr = &tools.Restored{From: r.From, Files: r.Files, Variables: r.Variables, NotRestored: r.NotRestored, ExecutionCount: r.ExecutionCount}
	}
	return kids[0], tr, nil
}
