package gateway

import (
	"sync"

	"github.com/sandloop/sandloop/internal/store"
)

// routes caches where sessions live (the sessions table), per gateway.
// Entries are dropped on the table's notifications (a deleted session, a
// fenced host) and all at once when the notification connection was
// lost. A stale entry is still safe: every proxied request carries the
// epoch it was placed under, and a host of another epoch answers 410.
type routes struct {
	mu     sync.Mutex
	max    int
	byID   map[string]store.Placement
	byHost map[string]map[string]struct{}
}

func newRoutes(max int) *routes {
	return &routes{max: max, byID: map[string]store.Placement{}, byHost: map[string]map[string]struct{}{}}
}

func (c *routes) get(id string) (store.Placement, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.byID[id]
	return p, ok
}

func (c *routes) put(p store.Placement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byID) >= c.max {
		c.clearLocked() // crude but bounded; misses are one indexed query
	}
	c.byID[p.ID] = p
	if c.byHost[p.Host] == nil {
		c.byHost[p.Host] = map[string]struct{}{}
	}
	c.byHost[p.Host][p.ID] = struct{}{}
}

func (c *routes) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.byID[id]; ok {
		delete(c.byID, id)
		delete(c.byHost[p.Host], id)
	}
}

func (c *routes) dropHost(host string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.byHost[host] {
		delete(c.byID, id)
	}
	delete(c.byHost, host)
}

func (c *routes) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearLocked()
}

func (c *routes) clearLocked() {
	c.byID = map[string]store.Placement{}
	c.byHost = map[string]map[string]struct{}{}
}

func (c *routes) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID)
}

// notify applies one payload of store.NotifyChannel ("" = drop all).
func (c *routes) notify(payload string) {
	switch {
	case payload == "":
		c.clear()
	case len(payload) > 2 && payload[:2] == "s:":
		c.drop(payload[2:])
	case len(payload) > 2 && payload[:2] == "h:":
		c.dropHost(payload[2:])
	default:
		c.clear() // unknown: be safe
	}
}
