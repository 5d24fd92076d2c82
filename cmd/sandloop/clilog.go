package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
)

// cliLogger is the logger of a command whose normal output is for a person
// (agent): warnings as one "sandloop: …" line each, the rest hidden; with
// verbose, every record as slog text.
func cliLogger(w io.Writer, verbose bool) *slog.Logger {
	if verbose {
		return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(&noteHandler{w: w, mu: new(sync.Mutex)})
}

// noteHandler prints warnings and errors as "sandloop: MESSAGE[: ERR]".
type noteHandler struct {
	w  io.Writer
	mu *sync.Mutex
}

func (h *noteHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *noteHandler) Handle(_ context.Context, r slog.Record) error {
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			msg += ": " + a.Value.String()
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintf(h.w, "sandloop: %s\n", msg)
	return err
}

func (h *noteHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *noteHandler) WithGroup(string) slog.Handler      { return h }
