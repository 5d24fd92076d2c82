package client

import (
	"context"
	"encoding/json"
	"net/http"
)

// MarshalJSON writes the options as POST /v1/sessions takes them: network
// is NetworkMode when set, and allow is sent when not nil (an empty list
// included).
func (o CreateOptions) MarshalJSON() ([]byte, error) {
	type plain CreateOptions // without this method
	b, err := json.Marshal(plain(o))
	if err != nil || o.NetworkMode == "" && o.Allow == nil {
		return b, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if o.NetworkMode != "" {
		m["network"] = o.NetworkMode
	}
	if o.Allow != nil {
		m["allow"] = o.Allow
	}
	return json.Marshal(m)
}

// UpdateNetwork replaces the allowlist of session id while it runs (nil or
// empty allows nothing): its next connections are judged by allow, and
// connections under way to what it no longer allows are cut. The list is
// held to the server's --allow-max (APIError code "network_not_allowed").
// A session created without an egress proxy (network "none" or "host")
// cannot get one: APIError 409 "no_allowlist".
func (c *Client) UpdateNetwork(ctx context.Context, id string, allow []string) (*Session, error) {
	if allow == nil {
		allow = []string{}
	}
	var s Session
	if err := c.doJSON(ctx, http.MethodPatch, c.sessionPath(id, "/network"), nil, map[string][]string{"allow": allow}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
