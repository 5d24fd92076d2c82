// Package egress lets a sandbox out to the network through an allowlist:
// an HTTP forward proxy (plain requests and CONNECT tunnels) run on the host
// side, one per session, that resolves names itself, refuses addresses of
// the host's own and private networks, caps bytes and connections, and logs
// every connection.
//
// The sandbox itself keeps a network namespace with only loopback: the
// proxy's listening socket lives on that loopback (the jail's init opens it
// and hands it to the host, see jail.Config.ListenPort), so ordinary
// clients inside reach it as http://127.0.0.1:3128 through the proxy
// variables Env sets, and only the host accepts on it. There is no route
// and no DNS resolver inside: every byte that leaves goes through Gate.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Mode is a sandbox's network mode.
type Mode string

const (
	// ModeNone: only the sandbox's own loopback (the default).
	ModeNone Mode = "none"
	// ModeAllow: loopback, and the names of an allowlist through the proxy.
	ModeAllow Mode = "allow"
	// ModeHost: the host's whole network (trusted code only; a server
	// must be started with a flag that permits it).
	ModeHost Mode = "host"
)

// ParseMode reads a mode name; "" is ModeNone.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", ModeNone:
		return ModeNone, nil
	case ModeAllow, ModeHost:
		return Mode(s), nil
	}
	return "", fmt.Errorf("network mode %q is not none, allow or host", s)
}

// Presets are named allowlists; an entry of an allowlist may be a preset's
// name. They are product data: tests never contact these hosts.
var Presets = map[string][]string{
	// The Python package index and the host its files are served from.
	"pypi": {"pypi.org", "files.pythonhosted.org"},
	// Source archives and raw files of public repositories.
	"github": {"github.com", "codeload.github.com", "raw.githubusercontent.com", "objects.githubusercontent.com"},
}

// PresetNames returns the presets' names, sorted.
func PresetNames() []string {
	out := make([]string, 0, len(Presets))
	for k := range Presets {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Port is the port the proxy listens on inside the sandbox.
const Port = 3128

// HostName is the name by which sandboxed code reaches the host's own
// loopback through the proxy, where an entry lists it (localhost:8000,
// 127.0.0.1:8000). Inside the sandbox, localhost and 127.0.0.1 are the
// sandbox's own loopback (NO_PROXY keeps them local, so that a server the
// code starts is tested from inside): the host's port 8000 is
// http://host.sandloop.internal:8000. ".internal" is reserved for private
// use and never resolves in public DNS.
const HostName = "host.sandloop.internal"

var hostLoopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// defaultPorts are the ports an entry without one allows.
var defaultPorts = []int{80, 443}

// rule allows a target: a name (exact, or every subdomain with a "*."
// pattern), an address, or a range of addresses; on ports (nil: any).
type rule struct {
	name   string       // lower case, no trailing dot; "" for an address rule
	suffix bool         // name is "*.suffix": subdomains of suffix only
	prefix netip.Prefix // an address rule (a single address is a /32 or /128)
	ports  []int        // nil: any port
}

// Allowlist is a parsed list of allowed targets.
type Allowlist struct {
	rules   []rule
	entries []string // as written (presets expanded), for messages
}

// Entries returns the allowlist as written, presets expanded.
func (a *Allowlist) Entries() []string {
	if a == nil {
		return nil
	}
	return slices.Clone(a.entries)
}

// ParseAllowlist reads allowlist entries. Each is a preset's name (pypi,
// github), a host name ("example.org"), every subdomain of one
// ("*.example.org", not example.org itself), an IP address ("10.0.0.5",
// "[fd00::5]:8080") or a range ("10.0.0.0/8"), optionally followed by
// ":PORT" or ":*" (any port). A name or address without a port allows
// ports 80 and 443; a range allows any port. Addresses of the host's own,
// private, link-local, multicast and CGNAT networks (and cloud metadata
// endpoints) are refused unless an address or range entry covers them,
// whatever name resolves there.
func ParseAllowlist(entries []string) (*Allowlist, error) {
	a := &Allowlist{}
	for _, raw := range entries {
		e := strings.TrimSpace(raw)
		if p, ok := Presets[strings.ToLower(e)]; ok {
			for _, x := range p {
				if err := a.add(x); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := a.add(e); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *Allowlist) add(e string) error {
	bad := func(why string) error {
		return fmt.Errorf("allowlist entry %q: %s (write a host name like example.org, *.example.org, example.org:8443, an address, a range like 10.0.0.0/8, or a preset: %s)",
			e, why, strings.Join(PresetNames(), ", "))
	}
	if e == "" {
		return bad("empty")
	}
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return bad("not a range")
		}
		a.rules = append(a.rules, rule{prefix: p.Masked()})
		a.entries = append(a.entries, e)
		return nil
	}
	host, portText := e, ""
	if ap, err := netip.ParseAddrPort(strings.Replace(e, ":*", ":0", 1)); err == nil {
		host, portText = ap.Addr().String(), strings.TrimPrefix(e[strings.LastIndex(e, ":"):], ":")
	} else if ad, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
		host = ad.String()
	} else if i := strings.LastIndex(e, ":"); i >= 0 {
		host, portText = e[:i], e[i+1:]
	}
	r := rule{ports: defaultPorts}
	switch portText {
	case "":
	case "*":
		r.ports = nil
	default:
		n, err := strconv.Atoi(portText)
		if err != nil || n < 1 || n > 65535 {
			return bad("the port must be 1-65535 or *")
		}
		r.ports = []int{n}
	}
	if ad, err := netip.ParseAddr(host); err == nil {
		r.prefix = netip.PrefixFrom(ad.Unmap(), ad.Unmap().BitLen())
		a.rules = append(a.rules, r)
		a.entries = append(a.entries, e)
		return nil
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if name == "localhost" || name == HostName {
		// The host's loopback: an address entry, as 127.0.0.1 would be.
		r.prefix = netip.PrefixFrom(hostLoopback, 32)
		a.rules = append(a.rules, r)
		a.entries = append(a.entries, e)
		return nil
	}
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		r.suffix, name = true, rest
	}
	if !validName(name) {
		return bad("not a host name")
	}
	r.name = name
	a.rules = append(a.rules, r)
	a.entries = append(a.entries, e)
	return nil
}

// validName reports whether s is a DNS name of letters, digits, '-', '_'
// and dots (no wildcard left in it).
func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func (r rule) portOK(port int) bool { return r.ports == nil || slices.Contains(r.ports, port) }

// allowsName reports whether the name (lower case) on port may be asked for.
func (a *Allowlist) allowsName(name string, port int) bool {
	if a == nil {
		return false
	}
	for _, r := range a.rules {
		if r.name == "" || !r.portOK(port) {
			continue
		}
		if !r.suffix && r.name == name || r.suffix && strings.HasSuffix(name, "."+r.name) {
			return true
		}
	}
	return false
}

// allowsAddrTarget reports whether an address literal on port may be asked for.
func (a *Allowlist) allowsAddrTarget(ad netip.Addr, port int) bool {
	if a == nil {
		return false
	}
	for _, r := range a.rules {
		if r.name == "" && r.portOK(port) && r.prefix.Contains(ad) {
			return true
		}
	}
	return false
}

// HostNote says how sandboxed code reaches the host's loopback ports the
// allowlist lists ("" if it lists none): at HostName, as localhost inside
// the sandbox is the sandbox's own.
func (a *Allowlist) HostNote() string {
	if a == nil {
		return ""
	}
	var at []string
	for i, r := range a.rules {
		if r.name != "" || !r.prefix.Contains(hostLoopback) && !r.prefix.Contains(netip.IPv6Loopback()) {
			continue
		}
		if r.ports == nil {
			at = append(at, HostName+":PORT (any port, from "+a.entries[i]+")")
			continue
		}
		for _, p := range r.ports {
			at = append(at, HostName+":"+strconv.Itoa(p))
		}
	}
	if len(at) == 0 {
		return ""
	}
	return "inside the sandbox, localhost and 127.0.0.1 are the sandbox's own loopback; the host's listed ports are reached through the proxy at " +
		strings.Join(slices.Compact(at), ", ") + " (e.g. requests.get(\"http://" + strings.SplitN(at[0], " ", 2)[0] + "/\"))"
}

// HostNote is Allowlist.HostNote for entries as written ("" if they do not parse).
func HostNote(entries []string) string {
	a, err := ParseAllowlist(entries)
	if err != nil {
		return ""
	}
	return a.HostNote()
}

// coversAddr reports whether an address or range entry names ad, which
// makes it dialable even if it is not public.
func (a *Allowlist) coversAddr(ad netip.Addr) bool {
	if a == nil {
		return false
	}
	for _, r := range a.rules {
		if r.name == "" && r.prefix.Contains(ad) {
			return true
		}
	}
	return false
}

// Within checks that every entry of a is covered by an entry of max: the
// same or a broader name pattern, a range holding the addresses, and the
// ports. With a nil max, host names are all allowed and addresses and
// ranges (which open private networks) are not.
func (a *Allowlist) Within(max *Allowlist) error {
	var out []string
	for i, r := range a.rules {
		if !max.covers(r) {
			out = append(out, a.entries[i])
		}
	}
	if len(out) == 0 {
		return nil
	}
	if max == nil {
		return fmt.Errorf("%s: addresses and ranges may be listed only if the server allows them", strings.Join(out, ", "))
	}
	return fmt.Errorf("%s: not within what this server allows (%s)", strings.Join(out, ", "), strings.Join(max.entries, ", "))
}

func (max *Allowlist) covers(r rule) bool {
	if max == nil {
		return r.name != ""
	}
	for _, m := range max.rules {
		if m.ports != nil && (r.ports == nil || slices.ContainsFunc(r.ports, func(p int) bool { return !slices.Contains(m.ports, p) })) {
			continue
		}
		switch {
		case r.name == "" && m.name == "":
			if m.prefix.Bits() <= r.prefix.Bits() && m.prefix.Contains(r.prefix.Addr()) {
				return true
			}
		case r.name != "" && m.name != "":
			under := m.suffix && strings.HasSuffix(r.name, "."+m.name)
			if !r.suffix && (!m.suffix && m.name == r.name || under) || r.suffix && m.suffix && (m.name == r.name || under) {
				return true
			}
		}
	}
	return false
}

// Policy is what one session may reach and how much.
type Policy struct {
	// Allow lists the allowed targets. Nil allows nothing.
	Allow *Allowlist
	// Deny lists host addresses never dialled, whatever Allow says (the
	// server's own API, for example).
	Deny []netip.AddrPort
	// MaxBytes caps the bytes through the proxy (both directions, all
	// connections) over the session's life. If zero, 1 GiB.
	MaxBytes int64
	// MaxConns caps concurrent connections. If zero, 32.
	MaxConns int
	// DialTimeout bounds resolving and connecting. If zero, 15 seconds.
	DialTimeout time.Duration
	// IdleTimeout closes a connection with no traffic either way for this
	// long. If zero, 2 minutes.
	IdleTimeout time.Duration
}

// AllowEntries returns the allowlist's entries, presets expanded (nil for
// a nil policy).
func (p *Policy) AllowEntries() []string {
	if p == nil {
		return nil
	}
	return p.Allow.Entries()
}

func (p Policy) withDefaults() Policy {
	if p.MaxBytes == 0 {
		p.MaxBytes = 1 << 30
	}
	if p.MaxConns == 0 {
		p.MaxConns = 32
	}
	if p.DialTimeout == 0 {
		p.DialTimeout = 15 * time.Second
	}
	if p.IdleTimeout == 0 {
		p.IdleTimeout = 2 * time.Minute
	}
	return p
}

// blocked are the networks refused unless an entry covers them, with why.
var blocked = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "the cloud metadata endpoint"},
	{netip.MustParsePrefix("168.63.129.16/32"), "a cloud metadata endpoint"},
	{netip.MustParsePrefix("100.100.100.200/32"), "a cloud metadata endpoint"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "the cloud metadata endpoint"},
	{netip.MustParsePrefix("0.0.0.0/8"), "this host"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback (this host)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private network"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private network"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT (shared address space)"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "this host"},
	{netip.MustParsePrefix("::1/128"), "loopback (this host)"},
	{netip.MustParsePrefix("fc00::/7"), "a private network (unique local)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
}

// embeddedV4 returns the IPv4 address carried by NAT64 (64:ff9b::/96) and
// 6to4 (2002::/16) addresses, whose traffic reaches that IPv4 address.
func embeddedV4(ad netip.Addr) (netip.Addr, bool) {
	if !ad.Is6() {
		return netip.Addr{}, false
	}
	b := ad.As16()
	switch {
	case netip.MustParsePrefix("64:ff9b::/96").Contains(ad):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case netip.MustParsePrefix("2002::/16").Contains(ad):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// forbidden says why ad must not be dialled under al ("" if it may be).
func (p *Policy) forbidden(al *Allowlist, ad netip.Addr, port int) string {
	ad = ad.Unmap()
	for _, d := range p.Deny {
		if d.Addr().Unmap() == ad && (d.Port() == 0 || int(d.Port()) == port) {
			return "sandloop's own service"
		}
		if d.Addr().IsUnspecified() && (d.Port() == 0 || int(d.Port()) == port) && isLocal(ad) {
			return "sandloop's own service"
		}
	}
	if al.coversAddr(ad) {
		return ""
	}
	check := ad
	if v4, ok := embeddedV4(ad); ok {
		check = v4
	}
	for _, b := range blocked {
		if b.prefix.Contains(check) {
			return b.why
		}
	}
	if check.Is4() && check == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "broadcast"
	}
	return ""
}

// isLocal reports whether ad is one of this host's loopback addresses
// (a server listening on 0.0.0.0 answers on them all).
func isLocal(ad netip.Addr) bool { return ad.IsLoopback() || ad.IsUnspecified() }

// RefusedError is why the proxy refused a target, in words for the code
// and the model.
type RefusedError struct {
	Host   string
	Reason string
}

func (e *RefusedError) Error() string { return "sandloop: " + e.Reason }

var errCap = errors.New("cap reached")
