package e2b

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/workspace"
)

// files.watchDir: envd's filesystem.Filesystem/WatchDir stream (the JS
// SDK's) and CreateWatcher/GetWatcherEvents/RemoveWatcher (the Python sync
// SDK's), over inotify on the host side of the sandbox's workspace
// (watch_linux.go). Whatever writes there — the kernel, a command, the
// files API — is reported, with names relative to the watched directory.

// Bounds of watching, per sandbox.
const (
	// maxWatchers caps a sandbox's watchers (streams and sync ones).
	maxWatchers = 16
	// maxWatchDirs caps the directories one recursive watcher follows.
	maxWatchDirs = 2048
	// maxQueuedEvents caps the events a sync watcher holds between two
	// GetWatcherEvents.
	maxQueuedEvents = 4096
	// maxHostWatchers caps the watchers of all sandboxes: each is an
	// inotify instance, of which a user has 128 by default
	// (fs.inotify.max_user_instances), shared with the host's other
	// programs.
	maxHostWatchers = 64
)

// hostWatchers counts the watchers of this process (inotify instances are
// counted per user, not per handler).
var hostWatchers atomic.Int32

type eventType string

const (
	eventCreate eventType = "EVENT_TYPE_CREATE"
	eventWrite  eventType = "EVENT_TYPE_WRITE"
	eventRemove eventType = "EVENT_TYPE_REMOVE"
	eventRename eventType = "EVENT_TYPE_RENAME"
	eventChmod  eventType = "EVENT_TYPE_CHMOD"
)

// fsEvent is envd's FilesystemEvent.
type fsEvent struct {
	Name  string     `json:"name"`
	Type  eventType  `json:"type"`
	Entry *entryInfo `json:"entry,omitempty"`
}

type watchDirRequest struct {
	Path               string `json:"path"`
	Recursive          bool   `json:"recursive"`
	IncludeEntry       bool   `json:"includeEntry"`
	AllowNetworkMounts bool   `json:"allowNetworkMounts"`
}

type watchDirResponse struct {
	Start      *struct{} `json:"start,omitempty"`
	Filesystem *fsEvent  `json:"filesystem,omitempty"`
	Keepalive  *struct{} `json:"keepalive,omitempty"`
}

type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

type watcherEventsResponse struct {
	Events []fsEvent `json:"events"`
}

// errWatchOverflow: events came faster than they were taken.
var errWatchOverflow = errors.New("events came faster than they were read and some were lost: watch again (a smaller tree, or read more often)")

// watch is one watcher of a sandbox.
type watch struct {
	id   string
	sb   *sandbox
	w    *dirWatcher
	ws   *workspace.Workspace
	stop sync.Once

	// A stream's events; a sync watcher's are queued instead.
	events chan fsEvent

	mu     sync.Mutex
	queued []fsEvent
	err    error // why a sync watcher stopped
}

// startWatch starts watching req.Path in the request's sandbox. deliver
// is called for each event, on the watcher's own goroutine; it returns
// false to stop.
func (h *Handler) startWatch(ctx context.Context, req *watchDirRequest, sync bool) (*watch, error) {
	rel, err := relPath(req.Path)
	if err != nil {
		return nil, rpcError(err)
	}
	sb := sandboxOf(ctx)
	ws, err := h.files(sb)
	if err != nil {
		return nil, rpcError(err)
	}
	wt := &watch{id: randomHex(8), sb: sb, ws: ws}
	if !sync {
		wt.events = make(chan fsEvent, 256)
	}
	sb.mu.Lock()
	switch {
	case sb.done:
		err = connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
	case len(sb.watches) >= maxWatchers:
		err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("a sandbox has at most %d watchers: stop one first", maxWatchers))
	case hostWatchers.Add(1) > maxHostWatchers:
		hostWatchers.Add(-1)
		err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("this server watches %d directories for its sandboxes, as many as it may: stop a watcher, or retry later", maxHostWatchers))
	default:
		// Reserved (counted, not yet usable) until the watch is set up.
		if sb.watches == nil {
			sb.watches = map[string]*watch{}
		}
		sb.watches[wt.id] = nil
	}
	sb.mu.Unlock()
	if err != nil {
		ws.Close()
		return nil, err
	}
	release := func() {
		sb.mu.Lock()
		delete(sb.watches, wt.id)
		sb.mu.Unlock()
		hostWatchers.Add(-1)
	}
	entry := func(name string) *entryInfo {
		if !req.IncludeEntry {
			return nil
		}
		e, err := ws.Stat(joinRel(rel, name))
		if err != nil {
			return nil // gone meanwhile
		}
		info := toEntryInfo(areaHome, e)
		return &info
	}
	deliver := func(ev fsEvent) bool {
		if ev.Type != eventRemove && ev.Type != eventRename {
			ev.Entry = entry(ev.Name)
		}
		if wt.events != nil {
			wt.events <- ev // the stream takes them; close ends the watcher first
			return true
		}
		wt.mu.Lock()
		defer wt.mu.Unlock()
		if len(wt.queued) >= maxQueuedEvents {
			wt.err = fmt.Errorf("more than %d events came between two GetWatcherEvents: the watcher was stopped; create a new one and read it more often", maxQueuedEvents)
			return false
		}
		wt.queued = append(wt.queued, ev)
		return true
	}
	wt.w, err = watchDir(ws, rel, req.Recursive, maxWatchDirs, deliver)
	if err != nil {
		release()
		ws.Close()
		return nil, rpcError(err)
	}
	sb.mu.Lock()
	_, reserved := sb.watches[wt.id]
	if reserved && !sb.done {
		sb.watches[wt.id] = wt
	}
	sb.mu.Unlock()
	if !reserved || sb.killedError() != nil {
		// The sandbox was killed meanwhile.
		wt.close()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
	}
	return wt, nil
}

// joinRel joins a name relative to the watched directory to its path.
func joinRel(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// close stops the watcher and forgets it.
func (wt *watch) close() {
	wt.stop.Do(func() {
		wt.sb.mu.Lock()
		if cur, ok := wt.sb.watches[wt.id]; ok && (cur == wt || cur == nil) {
			delete(wt.sb.watches, wt.id)
			hostWatchers.Add(-1)
		}
		wt.sb.mu.Unlock()
		if wt.w != nil {
			// A stream's pending event is dropped, so the reader can end.
			if wt.events != nil {
				go func() {
					for range wt.events {
					}
				}()
			}
			wt.w.close()
			if wt.events != nil {
				close(wt.events)
			}
		}
		wt.ws.Close()
	})
}

// closeWatches stops every watcher of a sandbox being killed.
func (sb *sandbox) closeWatches() {
	sb.mu.Lock()
	var all []*watch
	for _, wt := range sb.watches {
		if wt != nil { // (a watch being set up sees the sandbox is done)
			all = append(all, wt)
		}
	}
	sb.mu.Unlock()
	for _, wt := range all {
		wt.close()
	}
}

// killedError is the error of a stream whose sandbox was killed (nil if
// it runs).
func (sb *sandbox) killedError() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.done {
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
	}
	return nil
}

// keepaliveInterval reads Keepalive-Ping-Interval (seconds), which the SDKs
// send; without it, none.
func keepaliveInterval(v string) time.Duration {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, 3600)) * time.Second
}

// watchDirStream is WatchDir: {start} first, then one message per
// operation, and keepalives while idle, until the client stops (which
// drops the watcher), the Connect-Timeout-Ms deadline or the sandbox ends.
func (h *Handler) watchDirStream(ctx context.Context, req *connect.Request[watchDirRequest], stream *connect.ServerStream[watchDirResponse]) error {
	wt, err := h.startWatch(ctx, req.Msg, false)
	if err != nil {
		return err
	}
	defer wt.close()
	if err := stream.Send(&watchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	var tick <-chan time.Time
	if d := keepaliveInterval(req.Header().Get("Keepalive-Ping-Interval")); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev, ok := <-wt.events:
			if !ok {
				return wt.sb.killedError()
			}
			if err := stream.Send(&watchDirResponse{Filesystem: &ev}); err != nil {
				return err
			}
		case <-wt.w.done:
			// What was delivered before the end is sent first.
		drain:
			for {
				select {
				case ev, ok := <-wt.events:
					if !ok {
						break drain
					}
					if err := stream.Send(&watchDirResponse{Filesystem: &ev}); err != nil {
						return err
					}
				default:
					break drain
				}
			}
			if err := wt.sb.killedError(); err != nil {
				return err
			}
			return watchEndError(wt.w.err())
		case <-tick:
			if err := stream.Send(&watchDirResponse{Keepalive: &struct{}{}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the watch's timeout passed"))
			}
			return ctx.Err()
		}
	}
}

// watchEndError says why a watcher ended on its own (nil: the watched
// directory is gone).
func watchEndError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errWatchOverflow):
		return connect.NewError(connect.CodeResourceExhausted, err)
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(connect.CodeInternal, err)
}

func (h *Handler) createWatcher(ctx context.Context, req *watchDirRequest) (*createWatcherResponse, error) {
	wt, err := h.startWatch(ctx, req, true)
	if err != nil {
		return nil, err
	}
	return &createWatcherResponse{WatcherID: wt.id}, nil
}

// findWatch returns the sandbox's sync watcher id.
func findWatch(ctx context.Context, id string) (*watch, error) {
	sb := sandboxOf(ctx)
	sb.mu.Lock()
	wt := sb.watches[id]
	sb.mu.Unlock()
	if wt == nil || wt.events != nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return wt, nil
}

// getWatcherEvents drains a sync watcher's queue.
func (h *Handler) getWatcherEvents(ctx context.Context, req *watcherRequest) (*watcherEventsResponse, error) {
	wt, err := findWatch(ctx, req.WatcherID)
	if err != nil {
		return nil, err
	}
	wt.mu.Lock()
	out := wt.queued
	wt.queued = nil
	stopped := wt.err
	wt.mu.Unlock()
	if stopped == nil {
		select {
		case <-wt.w.done:
			stopped = wt.w.err()
			if stopped == nil {
				stopped = errors.New("the watched directory is gone")
			}
		default:
		}
	}
	if stopped != nil {
		wt.close()
		return nil, connect.NewError(connect.CodeResourceExhausted, stopped)
	}
	if out == nil {
		out = []fsEvent{}
	}
	return &watcherEventsResponse{Events: out}, nil
}

func (h *Handler) removeWatcher(ctx context.Context, req *watcherRequest) (*empty, error) {
	wt, err := findWatch(ctx, req.WatcherID)
	if err != nil {
		return nil, err
	}
	wt.close()
	return &empty{}, nil
}
