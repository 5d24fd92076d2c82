package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
)

// A session whose host was lost comes back from its latest durable
// snapshot (issue 28): the gateway records each snapshot a host writes of
// a session (noteSnapshot), and the first request for the lost session
// starts a new session from it on a live host (same owner) and answers
// 307 Temporary Redirect to the same path under the new id. The answer
// carries Sandloop-Restored-From (the old id), Sandloop-Session-Id (the
// new one) and Sandloop-Restored (what came back: "files exact;
// variables restored: ...; not restorable: ..."); a client that follows
// redirects (as HTTP clients do for 307, method and body kept) reaches
// the restored session at once. Later requests of the old id answer the
// same redirect (restored_as in the sessions table), so one loss makes
// one restore. A lost session without a snapshot answers 410 as before.

// Headers of a redirect to a restored session.
const (
	HeaderRestoredFrom = "Sandloop-Restored-From"
	HeaderSessionID    = "Sandloop-Session-Id"
)

// lost answers a request for a session whose host epoch ended: a
// redirect to the session it was (or now is) restored as, or 410.
func (g *Gateway) lost(w http.ResponseWriter, r *http.Request, pl *store.Placement, mine bool) {
	if !mine || pl.Kind != store.KindSession || (pl.Snapshot == "" && pl.RestoredAs == "") {
		writeGone(w, pl)
		return
	}
	g.restoreMu.Lock()
	defer g.restoreMu.Unlock()
	// The table, not the cache: another request may have restored it.
	if cur, err := g.opts.Cluster.GetPlacement(r.Context(), pl.ID); err == nil {
		pl = cur
	}
	if pl.RestoredAs != "" {
		redirectRestored(w, r, pl.ID, pl.RestoredAs, "", nil)
		return
	}
	newID, summary, body, err := g.restore(r.Context(), pl, pl.Snapshot)
	if errors.Is(err, errSnapshotGone) {
		// A hibernation's snapshot is deleted when the session wakes:
		// its newest snapshot still in the store, if any, is the one.
		if snap := g.latestSnapshot(r.Context(), pl); snap != "" && snap != pl.Snapshot {
			newID, summary, body, err = g.restore(r.Context(), pl, snap)
		}
	}
	if err != nil {
		g.log.Warn("restore a lost session from its snapshot", "session", pl.ID, "snapshot", pl.Snapshot, "err", err)
		server.WriteError(w, http.StatusGone, "host_lost", fmt.Sprintf(
			"the host of session %s was lost and its snapshot %s could not be restored (%s); start a session from it with POST /v1/sessions {\"snapshot\": %q}",
			pl.ID, pl.Snapshot, err, pl.Snapshot), 0)
		return
	}
	got, err := g.opts.Cluster.SetRestoredAs(r.Context(), pl.ID, newID)
	if err != nil {
		g.log.Warn("record a restore", "session", pl.ID, "err", err)
		got = newID // the client still gets the session made for it
	}
	if got != newID {
		// Another gateway restored it first: give ours back.
		g.deleteOn(r.Context(), pl.Owner, newID)
		redirectRestored(w, r, pl.ID, got, "", nil)
		return
	}
	g.routes.drop(pl.ID)
	g.log.Info("lost session restored from its snapshot", "session", pl.ID, "as", newID, "snapshot", pl.Snapshot)
	redirectRestored(w, r, pl.ID, newID, summary, body)
}

// errSnapshotGone: a host answered 404 for the snapshot to restore.
var errSnapshotGone = errors.New("the snapshot is no longer stored")

// restore starts a session from pl's snapshot snap on a live host other
// than pl's and records where it went. It returns its id, the host's
// Sandloop-Restored summary and the session as the host showed it.
func (g *Gateway) restore(ctx context.Context, pl *store.Placement, snap string) (id, summary string, session json.RawMessage, err error) {
	reqBody, _ := json.Marshal(map[string]string{"snapshot": snap})
	tried := map[string]bool{pl.Host: true}
	err = errors.New("no live host can take a session now")
	for {
		name, round := g.hosts.pick(tried, "", false, g.randN)
		if name == "" {
			return "", "", nil, err
		}
		tried[name] = true
		u, epoch, _, ok := g.hosts.get(name)
		if !ok {
			continue
		}
		req, rerr := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodPost, u.JoinPath("/v1/sessions").String(), bytes.NewReader(reqBody))
		if rerr != nil {
			return "", "", nil, rerr
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
		req.Header.Set(server.HeaderOwner, pl.Owner)
		req.Header.Set(server.HeaderEpoch, epoch)
		resp, rerr := g.client.Do(req)
		if rerr != nil {
			g.hosts.unpick(name, round)
			err = fmt.Errorf("host %s: %w", name, rerr)
			continue
		}
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || rerr != nil {
			g.hosts.unpick(name, round)
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			err = fmt.Errorf("a host answered %d: %s", resp.StatusCode, cmpOr(e.Error.Message, "no reason given"))
			if resp.StatusCode == http.StatusNotFound {
				return "", "", nil, fmt.Errorf("%w: %w", errSnapshotGone, err)
			}
			if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity {
				return "", "", nil, err // the snapshot itself: another host says the same
			}
			continue
		}
		var made struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(b, &made) != nil || made.ID == "" {
			g.hosts.unpick(name, round)
			return "", "", nil, fmt.Errorf("host %s made a session but did not say its id", name)
		}
		npl := store.Placement{ID: made.ID, Kind: store.KindSession, Owner: pl.Owner, Host: name, Epoch: epoch, Snapshot: snap}
		if perr := g.opts.Cluster.PutPlacement(ctx, npl); perr != nil {
			g.deleteOn(ctx, pl.Owner, made.ID)
			g.hosts.unpick(name, round)
			return "", "", nil, perr
		}
		g.routes.put(npl)
		return made.ID, resp.Header.Get(server.HeaderRestored), b, nil
	}
}

// latestSnapshot asks a live host (the snapshot store is the cell's) for
// pl's newest snapshot; "" if none or no host answers.
func (g *Gateway) latestSnapshot(ctx context.Context, pl *store.Placement) string {
	for _, u := range g.hosts.reachableHosts() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.JoinPath("/v1/sessions", pl.ID, "snapshots").String(), nil)
		if err != nil {
			return ""
		}
		req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
		req.Header.Set(server.HeaderOwner, pl.Owner)
		resp, err := g.client.Do(req)
		if err != nil {
			continue
		}
		var list struct {
			Snapshots []struct {
				ID string `json:"id"`
			} `json:"snapshots"`
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&list)
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return ""
		}
		if resp.StatusCode == http.StatusOK && err == nil {
			if len(list.Snapshots) == 0 {
				return ""
			}
			return list.Snapshots[0].ID // newest first
		}
	}
	return ""
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// deleteOn deletes session id through its placement (a restore not kept).
func (g *Gateway) deleteOn(ctx context.Context, owner, id string) {
	pl, err := g.opts.Cluster.GetPlacement(ctx, id)
	if err != nil {
		return
	}
	u, epoch, _, ok := g.hosts.get(pl.Host)
	if !ok {
		return
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodDelete, u.JoinPath("/v1/sessions", id).String(), nil)
	if err != nil {
		return
	}
	req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
	req.Header.Set(server.HeaderOwner, owner)
	req.Header.Set(server.HeaderEpoch, epoch)
	if resp, err := g.client.Do(req); err == nil {
		resp.Body.Close()
	}
	g.routes.drop(id)
	_ = g.opts.Cluster.DeletePlacement(context.WithoutCancel(ctx), id)
}

// redirectRestored answers 307 to r's path under the session to. summary
// and session are said on the answer that restored it (else empty).
func redirectRestored(w http.ResponseWriter, r *http.Request, from, to, summary string, session json.RawMessage) {
	prefix := "/v1/sessions/" + from
	loc := &url.URL{Path: "/v1/sessions/" + to + strings.TrimPrefix(r.URL.Path, prefix), RawQuery: r.URL.RawQuery}
	w.Header().Set("Location", loc.String())
	w.Header().Set(HeaderRestoredFrom, from)
	w.Header().Set(HeaderSessionID, to)
	if summary != "" {
		w.Header().Set(server.HeaderRestored, summary)
	}
	msg := fmt.Sprintf("the host of session %s was lost; the session was restored from its latest snapshot as %s: use that id from now on", from, to)
	out := map[string]any{"restored_from": from, "id": to, "message": msg}
	if session != nil {
		out["session"] = session
	}
	server.WriteJSON(w, http.StatusTemporaryRedirect, out)
}
