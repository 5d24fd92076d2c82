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
}

// Discovery finds a cell's hosts. Targets is called on every health round
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
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("--hosts: %q is not a host's base URL (http://HOST:PORT)", s)
		}
		if seen[u.Host] {
			return nil, fmt.Errorf("--hosts: %s is listed twice", u.Host)
		}
		seen[u.Host] = true
		out = append(out, Target{Name: u.Host, URL: u.Scheme + "://" + u.Host})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--hosts: no host given")
	}
	return out, nil
}
