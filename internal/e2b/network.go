package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/session"
)

// NetworkOptions are what a sandbox may reach, E2B's `network` at create
// and `updateNetwork`. Every sandbox gets sandloop's egress proxy from its
// start (its kernel has the proxy's variables), so that updateNetwork
// reaches the kernel already running.
//
// E2B's sandboxes reach the whole internet unless told otherwise;
// sandloop's reach only what an allowlist names. So allowOut is the list
// when traffic is closed (`0.0.0.0/0`, ALL_TRAFFIC, in denyOut, or
// allow_internet_access false), and traffic left open means Default (the
// server's own list for sessions that ask for none) plus allowOut.
type NetworkOptions struct {
	// Policy holds the caps, timeouts and denied addresses (the server's
	// own) of every sandbox's proxy. Its Allow is ignored.
	Policy egress.Policy
	// Max bounds allowOut, as serve's --allow-max does sandloop's own
	// allowlists. If nil, host names only: no addresses or ranges.
	Max *egress.Allowlist
	// Default is what a sandbox whose traffic is left open may reach (the
	// server's --allow list when its default network is allow). If
	// empty, nothing.
	Default []string
	// Lookup resolves names for the proxies of extra code contexts (the
	// manager's EgressLookup does for the sandboxes' own kernels). If
	// nil, the host's resolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// allTraffic is E2B's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// networkRequest is the network part of create's body.
type networkRequest struct {
	Network             *networkJSON `json:"network"`
	AllowInternetAccess *bool        `json:"allow_internet_access"`
}

// networkJSON is E2B's network configuration: updateNetwork's body (with
// allow_internet_access beside it), create's `network`, getInfo's
// `network` (what is in force, as the client sent it).
type networkJSON struct {
	AllowOut    []string       `json:"allowOut,omitempty"`
	DenyOut     []string       `json:"denyOut,omitempty"`
	Rules       map[string]any `json:"rules,omitempty"`
	EgressProxy map[string]any `json:"egressProxy,omitempty"`
	// At create only, about traffic into the sandbox; kept for getInfo.
	AllowPublicTraffic *bool  `json:"allowPublicTraffic,omitempty"`
	MaskRequestHost    string `json:"maskRequestHost,omitempty"`
	HTTPSPorts         []int  `json:"httpsPorts,omitempty"`
}

// updateNetworkRequest is PUT /sandboxes/{id}/network's body.
type updateNetworkRequest struct {
	networkJSON
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// networkState is a sandbox's network configuration in force (under sb.mu).
type networkState struct {
	cfg    networkJSON
	access bool // allowInternetAccess, as getInfo reports it
}

// resolveNetwork checks an E2B network configuration and returns the
// allowlist it means, with what getInfo will report. Errors are E2B's 400s
// (or a 403 beyond the server's maximum), in words that say what to send.
func (h *Handler) resolveNetwork(cfg networkJSON, internet *bool) (*egress.Allowlist, networkState, error) {
	st := networkState{cfg: cfg, access: internet == nil || *internet}
	if len(cfg.Rules) > 0 {
		return nil, st, badNetwork("network.rules (header transforms) are not supported by sandloop: its proxy does not see inside HTTPS; leave rules out")
	}
	if len(cfg.EgressProxy) > 0 {
		return nil, st, badNetwork("network.egressProxy is not supported by sandloop: its own proxy carries the sandbox's traffic; leave egressProxy out")
	}
	if m := cfg.MaskRequestHost; m != "" && (len(m) > 255 || strings.ContainsFunc(m, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '/' })) {
		return nil, st, badNetwork(fmt.Sprintf("network.maskRequestHost %q: must be a host name, with :PORT or ${PORT} if wanted (e.g. \"localhost:${PORT}\")", m))
	}
	for _, p := range cfg.HTTPSPorts {
		if p < 1 || p > 65535 || strconv.Itoa(p) == portEnvd || strconv.Itoa(p) == portInterpreter {
			return nil, st, badNetwork(fmt.Sprintf("network.httpsPorts: %d is not a port of the sandbox's apps (1-65535, not envd's %s nor the code interpreter's %s)", p, portEnvd, portInterpreter))
		}
	}
	closed := !st.access
	var subtract []string // denied ranges besides ALL_TRAFFIC
	for _, d := range cfg.DenyOut {
		if d == allTraffic {
			closed = true
			continue
		}
		if !ipOrCIDR(d) {
			return nil, st, badNetwork(fmt.Sprintf("invalid denied CIDR %q: denyOut takes IP addresses and CIDR ranges (e.g. %q), not domains", d, allTraffic))
		}
		subtract = append(subtract, d)
	}
	if closed {
		st.access = false
	}
	var domains []string
	for _, a := range cfg.AllowOut {
		if !ipOrCIDR(a) {
			domains = append(domains, a)
		}
	}
	list := slices.Clone(cfg.AllowOut)
	if !closed {
		if len(domains) > 0 {
			return nil, st, badNetwork(fmt.Sprintf("allowOut lists domains (%s): they need %q (ALL_TRAFFIC) in denyOut, so that only what allowOut names is reached", strings.Join(domains, ", "), allTraffic))
		}
		if len(subtract) > 0 && len(h.opts.Network.Default) > 0 {
			return nil, st, badNetwork(fmt.Sprintf("denyOut %s: sandloop cannot take ranges out of the hosts an open sandbox reaches here (%s); close traffic with denyOut [%q] and list what the sandbox may reach in allowOut",
				strings.Join(subtract, ", "), strings.Join(h.opts.Network.Default, ", "), allTraffic))
		}
		list = append(slices.Clone(h.opts.Network.Default), list...)
	}
	al, err := egress.ParseAllowlist(list)
	if err != nil {
		return nil, st, badNetwork("allowOut: " + err.Error())
	}
	// Default is the server's own choice; what the client lists is held to
	// the server's maximum.
	mine, _ := egress.ParseAllowlist(cfg.AllowOut)
	if err := mine.Within(h.opts.Network.Max); err != nil {
		return nil, st, &networkError{http.StatusForbidden, "allowOut: " + err.Error()}
	}
	return al, st, nil
}

// ipOrCIDR reports whether s is an IP address or a range, with or without
// a port (E2B's entries are host[:port]).
func ipOrCIDR(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	if _, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return true
	}
	_, err := netip.ParseAddrPort(s)
	return err == nil
}

// networkError is a refused network configuration: its status and words.
type networkError struct {
	status int
	msg    string
}

func (e *networkError) Error() string { return e.msg }

func badNetwork(msg string) error { return &networkError{http.StatusBadRequest, msg} }

// createEgress is the egress policy of a sandbox being created with req's
// network configuration, and the state getInfo reports.
func (h *Handler) createEgress(req networkRequest) (*egress.Policy, networkState, error) {
	var cfg networkJSON
	if req.Network != nil {
		cfg = *req.Network
	}
	al, st, err := h.resolveNetwork(cfg, req.AllowInternetAccess)
	if err != nil {
		return nil, st, err
	}
	p := h.opts.Network.Policy
	p.Allow = al
	return &p, st, nil
}

// writeNetworkError answers a refused network configuration.
func writeNetworkError(w http.ResponseWriter, err error) {
	var ne *networkError
	if errors.As(err, &ne) {
		writeControlError(w, ne.status, ne.msg)
		return
	}
	writeControlError(w, http.StatusInternalServerError, err.Error())
}

// updateNetwork is PUT /sandboxes/{id}/network (`sbx.updateNetwork`): the
// configuration replaces the one in force (an omitted field is cleared),
// and the sandbox's kernel, already running, is held to it from its next
// connection; connections under way to what it no longer allows are cut.
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, owner string) {
	var req updateNetworkRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	sb := h.owned(w, owner, r.PathValue("id"))
	if sb == nil {
		return
	}
	al, st, err := h.resolveNetwork(req.networkJSON, req.AllowInternetAccess)
	if err != nil {
		writeNetworkError(w, err)
		return
	}
	// At create only: they are about traffic into the sandbox.
	sb.mu.Lock()
	st.cfg.AllowPublicTraffic, st.cfg.MaskRequestHost, st.cfg.HTTPSPorts = sb.network.cfg.AllowPublicTraffic, sb.network.cfg.MaskRequestHost, sb.network.cfg.HTTPSPorts
	sb.mu.Unlock()
	if err := sb.setAllowlist(al); err != nil {
		if errors.Is(err, session.ErrNoEgress) {
			writeControlError(w, http.StatusConflict, fmt.Sprintf("sandbox %s has no egress proxy whose rules could change", sb.id))
			return
		}
		writeControlError(w, http.StatusInternalServerError, err.Error())
		return
	}
	sb.mu.Lock()
	sb.network, sb.networkSet = st, true
	sb.mu.Unlock()
	sb.saved()
	h.log.Info("e2b: sandbox network updated", "sandbox", sb.id, "allow", al.Entries())
	w.WriteHeader(http.StatusNoContent)
}

// networkInfo is getInfo's `network` and `allowInternetAccess`.
func (sb *sandbox) networkInfo() (*networkJSON, bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	cfg := sb.network.cfg
	return &cfg, sb.network.access
}

// setAllowlist puts al in force for the sandbox's kernel, then for its
// extra code contexts' (a context being made meanwhile takes it up in
// followNetwork: the sandbox's list is stored first).
func (sb *sandbox) setAllowlist(al *egress.Allowlist) error {
	if err := sb.ms.SetAllowlist(al); err != nil {
		return err
	}
	sb.mu.Lock()
	var own []*codeContext
	for _, c := range sb.contexts {
		if c.own {
			own = append(own, c)
		}
	}
	sb.mu.Unlock()
	for _, c := range own {
		c.s.SetAllowlist(al) // (a context without a proxy has nothing to change)
	}
	return nil
}

// contextEgress is the egress policy of an extra code context: the
// sandbox's list in force (nil if the sandbox has no proxy).
func (h *Handler) contextEgress(sb *sandbox) *egress.Policy {
	al := sb.ms.Allowlist()
	if al == nil {
		return nil
	}
	p := h.opts.Network.Policy
	p.Allow = al
	return &p
}

// followNetwork gives a context just registered the sandbox's list in
// force, which an update may have changed while its kernel started.
func (sb *sandbox) followNetwork(c *codeContext) {
	if al := sb.ms.Allowlist(); al != nil {
		c.s.SetAllowlist(al)
	}
}

// networkNow is the sandbox's network configuration in force (a fork's
// children start with it).
func (sb *sandbox) networkNow() networkState {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.network
}
