package gateway

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/sandloop/sandloop/internal/server"
	"github.com/sandloop/sandloop/internal/store"
)

// candidate is a host that could take a new session.
type candidate struct {
	name string
	free int // slots left, as last reported less this gateway's placements since
	// ready is the kernels the host has warm, as last reported (the
	// kernels of its warm pool and its zygote's spares, less the creates
	// waiting there), less this gateway's placements since: a session
	// placed there starts without waiting for a fork.
	ready int
}

// choose picks the candidate with the most kernels ready (none counted
// below zero), then the one with the most free slots; among equals, one
// at random (rnd(n) is in [0, n)). It returns -1 if none has a free slot.
//
// Placements are counted as they are made (hosts.pick), so a burst goes
// one session at a time to the host with the most ready kernels left: no
// host's pool runs dry while another's holds two more. Past every host's
// ready kernels, each session waits for a fork on demand wherever it
// goes, and the burst is spread by free slots, as sessions are between
// bursts. (Before issue 26 this was the better of two random hosts by
// free slots, with placements counted only once the host answered: a
// burst's requests, all sent before the first answer, went to whichever
// host looked best before it.)
func choose(cands []candidate, rnd func(int) int) int {
	best, equals := -1, 0
	for i, c := range cands {
		if c.free <= 0 {
			continue
		}
		if best >= 0 {
			b := cands[best]
			switch cmp := compareCandidates(c, b); {
			case cmp < 0:
				continue
			case cmp == 0:
				// The k-th equal replaces the one kept with chance 1/k:
				// each of them is picked as often.
				if equals++; rnd(equals) != 0 {
					continue
				}
			default:
				equals = 1
			}
		} else {
			equals = 1
		}
		best = i
	}
	return best
}

// compareCandidates is +1 if a is the better host for a new session, -1
// if b is, 0 if they are equal: kernels ready first, then free slots.
func compareCandidates(a, b candidate) int {
	if ra, rb := max(a.ready, 0), max(b.ready, 0); ra != rb {
		return cmp.Compare(ra, rb)
	}
	return cmp.Compare(a.free, b.free)
}

// place sends a request that makes a session (or run, or MCP session) to
// a host chosen by choose, and records where it went. A host that
// refuses (full: 429, draining: 503) is skipped for the next; the body is
// kept in memory for that (it is JSON, capped by MaxBodyBytes).
func (g *Gateway) place(kind string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.opts.MaxBodyBytes))
		if err != nil {
			server.WriteError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body larger than %d bytes", g.opts.MaxBodyBytes), 0)
			return
		}
		tmpl := ""
		if kind == store.KindSession {
			var req struct {
				Template *string `json:"template"`
			}
			if json.Unmarshal(body, &req) == nil && req.Template != nil {
				tmpl = *req.Template
			}
			if tmpl != "" && len(g.hosts.candidates(nil, tmpl)) == 0 {
				// No host has it. (Templates are not pulled from the
				// cell's storage: there is none for them yet.)
				server.WriteError(w, http.StatusNotFound, "template_not_found",
					fmt.Sprintf("no host of this cell has the template %s: build it on the hosts that should serve it (sandloop template build %s on each)", tmpl, tmpl), 0)
				return
			}
		}
		tried := map[string]bool{}
		var last *http.Response
		for {
			name, round := g.hosts.pick(tried, tmpl, g.slotsOnly, g.randN)
			if name == "" {
				break
			}
			tried[name] = true
			u, epoch, _, ok := g.hosts.get(name)
			if !ok {
				continue
			}
			out := r.Clone(r.Context())
			out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			if len(body) == 0 {
				out.Body = http.NoBody // else "unknown length": chunked, at odds with the copied Content-Length
			}
			out.RequestURI = ""
			out.URL = &url.URL{Scheme: u.Scheme, Host: u.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
			out.Host = ""
			out.Header = r.Header.Clone()
			out.Header.Del("Authorization")
			out.Header.Del("Content-Length") // the transport writes ContentLength's
			out.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
			out.Header.Set(server.HeaderOwner, ownerOf(r.Context()))
			scrubPortHeaders(out.Header)
			out.Header.Set(server.HeaderEpoch, epoch)
			resp, err := g.opts.Transport.RoundTrip(out)
			if err != nil {
				g.hosts.unpick(name, round)
				if r.Context().Err() != nil {
					return
				}
				g.log.Warn("place: host unreachable", "host", name, "err", err)
				continue
			}
			if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusGone {
				g.hosts.refused(name, resp.StatusCode != http.StatusTooManyRequests)
				g.hosts.unpick(name, round)
				if last != nil {
					last.Body.Close()
				}
				last = resp
				continue
			}
			if last != nil {
				last.Body.Close()
			}
			g.placed(w, r, kind, name, round, epoch, resp)
			return
		}
		if last != nil {
			// Every host refused: pass the last refusal on (429: full).
			defer last.Body.Close()
			copyResponse(w, last)
			return
		}
		server.WriteError(w, http.StatusServiceUnavailable, "no_capacity", "no host can take a new session now; retry shortly", 1)
	})
}

// placed records the new session the host made and passes its answer on;
// if it made none, the placement pick counted in round is taken back.
func (g *Gateway) placed(w http.ResponseWriter, r *http.Request, kind, hostName string, round int, epoch string, resp *http.Response) {
	defer resp.Body.Close()
	var id string
	switch kind {
	case store.KindMCP:
		id = resp.Header.Get("Mcp-Session-Id")
	default:
		if resp.StatusCode == http.StatusCreated {
			b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err != nil {
				g.hosts.unpick(hostName, round) // whatever it made is unknown; its next health answer tells
				server.WriteError(w, http.StatusBadGateway, "host_unreachable", "the host broke off its answer; retry", 1)
				return
			}
			var made struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(b, &made)
			id = made.ID
			resp.Body = io.NopCloser(bytes.NewReader(b))
		}
	}
	if id == "" {
		g.hosts.unpick(hostName, round)
	} else {
		pl := store.Placement{ID: id, Kind: kind, Owner: ownerOf(r.Context()), Host: hostName, Epoch: epoch}
		if err := g.opts.Cluster.PutPlacement(r.Context(), pl); err != nil {
			// Without a record nobody could reach it: give it back.
			g.log.Warn("record placement", "session", id, "err", err)
			g.undo(r, kind, hostName, id)
			g.hosts.unpick(hostName, round)
			server.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the sessions table cannot be written; retry shortly", 1)
			return
		}
		g.routes.put(pl)
	}
	copyResponse(w, resp)
}

// undo deletes a session whose placement could not be recorded.
func (g *Gateway) undo(r *http.Request, kind, hostName, id string) {
	u, epoch, _, ok := g.hosts.get(hostName)
	if !ok {
		return
	}
	var req *http.Request
	switch kind {
	case store.KindSession:
		req, _ = http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodDelete, u.JoinPath("/v1/sessions", id).String(), nil)
	case store.KindRun:
		req, _ = http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodPost, u.JoinPath("/v1/runs", id, "cancel").String(), nil)
	case store.KindMCP:
		req, _ = http.NewRequestWithContext(context.WithoutCancel(r.Context()), http.MethodDelete, u.JoinPath("/mcp").String(), nil)
		req.Header.Set("Mcp-Session-Id", id)
	}
	req.Header.Set(server.HeaderGatewaySecret, g.opts.Secret)
	req.Header.Set(server.HeaderOwner, ownerOf(r.Context()))
	req.Header.Set(server.HeaderEpoch, epoch)
	if resp, err := g.client.Do(req); err == nil {
		resp.Body.Close()
	}
}
