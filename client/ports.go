package client

import (
	"context"
	"net/http"
	"time"
)

// Port is a TCP port a server listens on inside a session (on its
// loopback or all of its addresses), with the two ways to reach it
// through the sandloop server.
type Port struct {
	Port int `json:"port"`
	// URL is the port's own host name, http://PORT-ID.localhost:N/:
	// browsers resolve *.localhost to the loopback; other clients dial the
	// server with that Host header. It needs the token as a bearer (or see
	// Preview).
	URL string `json:"url"`
	// PathURL is the native route, .../v1/sessions/ID/ports/PORT/.
	PathURL string `json:"path_url"`
}

// Ports lists the ports servers listen on in session id.
func (c *Client) Ports(ctx context.Context, id string) ([]Port, error) {
	var out struct {
		Ports []Port `json:"ports"`
	}
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, "/ports"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Ports, nil
}

// Preview is a signed URL of a port, to open in a browser without the
// token until ExpiresAt.
type Preview struct {
	URL       string    `json:"url"`
	PathURL   string    `json:"path_url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Preview asks for a signed URL of port in session id, valid for d (if
// zero, the server's default: an hour).
func (c *Client) Preview(ctx context.Context, id string, port int, d time.Duration) (*Preview, error) {
	in := map[string]any{"port": port}
	if d > 0 {
		in["expires_in_s"] = d.Seconds()
	}
	var p Preview
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/previews"), nil, in, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
