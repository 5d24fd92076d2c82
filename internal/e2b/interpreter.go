package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"time"

	"github.com/sandloop/sandloop/internal/eventstream"
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/session"
)

// defaultContextID names the sandbox's own kernel, which runs code sent
// without a context (or with language "python").
const defaultContextID = "default"

// codeContext is a Python kernel of a sandbox. The default one is the
// session's kernel; others are kernels of their own on the same workspace.
type codeContext struct {
	id, cwd string
	s       *session.Session
	own     bool // an extra kernel, closed with its context
}

type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (c *codeContext) json() contextJSON {
	return contextJSON{ID: c.id, Language: "python", Cwd: c.cwd}
}

func (h *Handler) interpreterRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("POST /execute", h.execute)
	mux.HandleFunc("POST /contexts", h.createContext)
	mux.HandleFunc("GET /contexts", h.listContexts)
	mux.HandleFunc("DELETE /contexts/{id}", h.deleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", h.restartContext)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("no code interpreter route %s %s on this server", r.Method, r.URL.Path))
	})
	return mux
}

// writeDetail is the code interpreter's error shape.
func writeDetail(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"detail": msg, "message": msg})
}

func (sb *sandbox) context(id string) *codeContext {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.contexts[id]
}

type contextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func checkLanguage(lang string) error {
	if lang != "" && lang != "python" && lang != "python3" {
		return fmt.Errorf("language %q is not supported: sandloop runs Python only", lang)
	}
	return nil
}

func (h *Handler) createContext(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	var req contextRequest
	if err := readJSON(r, &req); err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := checkLanguage(req.Language); err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	sb.mu.Lock()
	n := len(sb.contexts) - 1
	sb.mu.Unlock()
	if n >= h.opts.MaxContexts {
		writeDetail(w, http.StatusTooManyRequests, fmt.Sprintf("a sandbox holds at most %d code contexts besides the default: remove one first", h.opts.MaxContexts))
		return
	}
	cwd := homeDir
	if req.Cwd != "" {
		cwd = req.Cwd
		if !path.IsAbs(cwd) {
			cwd = path.Join(homeDir, cwd)
		}
	}
	s, err := session.New(r.Context(), &session.Options{
		Limits: sb.ms.Limits, Network: sb.ms.Network, Env: sb.envVars, Workspace: sb.ms.Workspace(),
		ExecTimeout: sb.ms.ExecTimeout, Zygote: h.opts.Zygote, Logger: h.log,
		Egress: h.contextEgress(sb), EgressLookup: h.opts.Network.Lookup, // network.go
	})

	if err != nil {
		writeDetail(w, http.StatusInternalServerError, "start a kernel for the context: "+err.Error())
		return
	}
	c := &codeContext{id: randomHex(8), cwd: cwd, s: s, own: true}
	if !isHome(cwd) {
		if err := chdir(r.Context(), c); err != nil {
			s.Close()
			writeDetail(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	sb.mu.Lock()
	if sb.done {
		sb.mu.Unlock()
		s.Close()
		http.Error(w, "the sandbox was killed", http.StatusBadGateway)
		return
	}
	if len(sb.contexts)-1 >= h.opts.MaxContexts { // raced with another create
		sb.mu.Unlock()
		s.Close()
		writeDetail(w, http.StatusTooManyRequests, fmt.Sprintf("a sandbox holds at most %d code contexts besides the default: remove one first", h.opts.MaxContexts))
		return
	}
	sb.contexts[c.id] = c
	sb.mu.Unlock()
	sb.followNetwork(c)
	writeJSON(w, http.StatusOK, c.json())
}

// chdir moves a context's kernel to its working directory (made if missing).
func chdir(ctx context.Context, c *codeContext) error {
	q, _ := json.Marshal(c.cwd)
	res, err := c.s.Execute(ctx, kernel.Request{Code: fmt.Sprintf("import os as _os; _os.makedirs(%s, exist_ok=True); _os.chdir(%s); del _os", q, q)}, nil)
	if err != nil {
		return err
	}
	if res.Error != nil {
		return fmt.Errorf("cwd %s: %s: %s", c.cwd, res.Error.Name, res.Error.Value)
	}
	return nil
}

func (h *Handler) listContexts(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	sb.mu.Lock()
	out := make([]contextJSON, 0, len(sb.contexts))
	for _, c := range sb.contexts {
		out = append(out, c.json())
	}
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deleteContext(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	id := r.PathValue("id")
	if id == defaultContextID {
		writeDetail(w, http.StatusBadRequest, "the default context cannot be removed: kill the sandbox instead")
		return
	}
	sb.mu.Lock()
	c := sb.contexts[id]
	delete(sb.contexts, id)
	sb.mu.Unlock()
	if c == nil {
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("context %q not found", id))
		return
	}
	c.s.Close()
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) restartContext(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	c := sb.context(r.PathValue("id"))
	if c == nil {
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("context %q not found", r.PathValue("id")))
		return
	}
	if err := c.s.Restart(r.Context()); err != nil {
		writeDetail(w, http.StatusInternalServerError, "restart: "+err.Error())
		return
	}
	if !isHome(c.cwd) {
		if err := chdir(r.Context(), c); err != nil {
			writeDetail(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// outputLine is one NDJSON line of /execute.
type outputLine map[string]any

// mimeKeys maps the kernel's MIME types to the fields of E2B's results.
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "text/latex": "latex",
	"image/png": "png", "image/jpeg": "jpeg", "image/svg+xml": "svg", "application/pdf": "pdf",
	"application/json": "json", "application/javascript": "javascript",
}

// resultLine turns a displayed value into E2B's result line; MIME types
// without a field of their own go to "extra".
func resultLine(e kernel.Event) outputLine {
	line := outputLine{"type": "result", "is_main_result": e.IsMainResult}
	extra := map[string]any{}
	for mt, v := range e.Data {
		key, ok := mimeKeys[mt]
		switch {
		case ok && key == "json":
			var j any
			if json.Unmarshal([]byte(v), &j) == nil {
				line[key] = j
			}
		case ok:
			line[key] = v
		default:
			extra[mt] = v
		}
	}
	if len(extra) > 0 {
		line["extra"] = extra
	}
	return line
}

// lossNotice is, once per restore, what a restore of the sandbox after
// its processes were lost, or a wake from hibernation that could not
// bring back everything, brought back and what it lost ("" if its latest
// restore was no such restore, or was told already).
func (sb *sandbox) lossNotice() string {
	res := sb.ms.Session.Restored()
	woke := res != nil && res.From == "hibernation" && len(res.NotRestored) > 0
	if res == nil || (res.AsOf.IsZero() && res.Lost == "" && !woke) {
		return ""
	}
	key := res.From + " " + res.AsOf.String()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.lossSaid == key {
		return ""
	}
	sb.lossSaid = key
	return "[sandloop] this sandbox was restored " + res.Summary() + "\n"
}

func timestamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// execute runs a cell, streaming NDJSON lines as they happen. The headers
// go out before the cell runs (the SDK's timeout starts with them); a
// client that goes away (its timeout) interrupts the cell, and the kernel
// keeps its state.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	var req executeRequest
	if err := readJSON(r, &req); err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Code == nil {
		writeDetail(w, http.StatusBadRequest, `field "code" is required`)
		return
	}
	if req.ContextID != "" && req.Language != "" {
		writeDetail(w, http.StatusBadRequest, "send either context_id or language, not both")
		return
	}
	if err := checkLanguage(req.Language); err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	id := req.ContextID
	if id == "" {
		id = defaultContextID
	}
	c := sb.context(id)
	if c == nil {
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("context %q not found", id))
		return
	}
	// Headers first: the SDK waits for them before it streams the cell.
	out := eventstream.New(w, func(h http.Header) {
		h.Set("Content-Type", "application/x-ndjson")
		h.Set("X-Accel-Buffering", "no")
	})
	frame := func(line outputLine) []byte {
		b, err := json.Marshal(line)
		if err != nil {
			return nil
		}
		return append(b, '\n')
	}
	write := func(line outputLine) {
		if b := frame(line); b != nil {
			out.Write(b)
		}
	}
	out.Write(nil)
	// A killed sandbox fails a write blocked on a client that stopped
	// reading, so the kill never waits on it.
	out.AbortOn(c.s.Done())
	out.Keepalive(h.opts.Keepalive, frame(outputLine{"type": "keepalive"}))
	defer out.Close()
	if c.s == sb.ms.Session {
		// A sandbox whose processes were lost (its keeper died) sleeps on
		// its latest snapshot: woken here rather than inside the cell, so
		// that what came back, and what did not, is said before the
		// cell's output (E2B's wire has no place of its own for it).
		if sb.ms.Hibernated() {
			if _, err := sb.ms.Wake(r.Context()); err != nil {
				write(outputLine{"type": "error", "name": "SandboxError", "value": "the sandbox could not be restored: " + err.Error(), "traceback": ""})
				return
			}
		}
		if n := sb.lossNotice(); n != "" {
			write(outputLine{"type": "stderr", "text": n, "timestamp": timestamp()})
		}
		// A cell is a use: the sandbox is written to its next automatic
		// snapshot (serve --snapshot-every).
		defer sb.ms.Lease()()
	}
	res, err := c.s.Execute(r.Context(), kernel.Request{Code: *req.Code, Env: req.EnvVars}, func(e kernel.Event) {
		switch e.Type {
		case kernel.EventStdout, kernel.EventStderr:
			write(outputLine{"type": e.Type, "text": e.Text, "timestamp": timestamp()})
		case kernel.EventResult:
			write(resultLine(e))
		case kernel.EventError:
			write(outputLine{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback})
		}
	})
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		return // the client went away before the cell started
	case err != nil:
		// The SDK reads a response that just ends as a successful cell:
		// say what happened.
		write(outputLine{"type": "error", "name": "SandboxError", "value": kernelGone(err), "traceback": ""})
		return
	}
	switch res.Status {
	case kernel.StatusTimeout:
		write(outputLine{"type": "error", "name": "TimeoutError", "value": "the cell ran past the sandbox's execution timeout and was interrupted; the kernel's state is kept", "traceback": ""})
	case kernel.StatusKilled:
		if res.Error == nil {
			write(outputLine{"type": "error", "name": "KernelDied", "value": "the kernel died: restart the context", "traceback": ""})
		}
	}
	write(outputLine{"type": "number_of_executions", "execution_count": res.ExecutionCount})
	write(outputLine{"type": "end_of_execution"})
}

func kernelGone(err error) string {
	switch {
	case errors.Is(err, session.ErrClosed):
		return "the sandbox was killed"
	case errors.Is(err, session.ErrRestartRequired):
		return err.Error() + ": restart the context (restartCodeContext) to go on"
	}
	return err.Error()
}

// isHome reports whether dir is the workspace, a kernel's own working
// directory (by either of its names): no chdir is needed.
func isHome(dir string) bool {
	c := path.Clean(dir)
	return c == homeDir || c == workspaceDir
}
