package gateway

import (
	"fmt"
	"net/url"
	"strings"
)

// Target is a host the discovery knows of: its name in the cell (stable
// across the host's restarts: the pod's name, or HOST:PORT) and base URL.
type Target struct {
	Name string
	URL  string
	// Draining: the discovery knows the host takes no new sessions (its
	// registration says so) before its health does.
	Draining bool
	// Templates, if the discovery knows them (a registration), are the
	// host's templates until its health answer lists them.
	Templates []string
}

// Discovery finds a cell's hosts: Static (--hosts), EndpointSlices
// (--kube-service) or Registered (--registered-hosts). Targets is called on every health round
// and must be cheap (a cached view, as an informer's).
type Discovery interface {
	Targets() []Target
}

// Static is a fixed list of hosts (--hosts), for use without Kubernetes.
type Static []Target

// Targets returns the list.
func (s Static) Targets() []Target { return s }

// ParseStatic reads a comma-separated list of host base URLs
// ("http://10.0.0.5:8080,http://10.0.0.6:8080"); each is named HOST:PORT.
func ParseStatic(list string) (Static, error) {
	var out Static
	seen := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		t, err := ParseHostURL(s)
		if err != nil {
			return nil, fmt.Errorf("--hosts: %w", err)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("--hosts: %s is listed twice", t.Name)
		}
		seen[t.Name] = true
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--hosts: no host given")
	}
	return out, nil
}

// ParseHostURL reads a host's base URL (http://HOST:PORT); the host is
// named HOST:PORT.
func ParseHostURL(s string) (Target, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return Target{}, fmt.Errorf("%q is not a host's base URL (http://HOST:PORT)", s)
	}
	return Target{Name: u.Host, URL: u.Scheme + "://" + u.Host}, nil
}
