// Package client is the Go SDK for sandloop's HTTP API: stateful,
// sandboxed Python sessions, their executions and their files.
//
// A failing user program is a Result with Status "error", never a Go
// error; errors returned by this package mean the request itself failed,
// and those the server reported are *APIError.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a Client. A nil *Options means the defaults.
type Options struct {
	// Token is sent as "Authorization: Bearer <token>". If empty, no
	// authentication (a server bound to loopback may run without tokens).
	Token string
	// HTTPClient sends the requests. If nil, a client with no overall
	// timeout (executions may be long; bound them with the context) whose
	// transport keeps up to 64 idle connections to the server.
	HTTPClient *http.Client
	// OnRestored, if set, is called when a session's host was lost and a
	// gateway restored the session from its latest snapshot under a new
	// id (it answers 307 to the same path under that id). The client has
	// then already followed the redirect (re-sending the request's body),
	// and from then on sends the old id's requests to the new id; see
	// Client.SessionID. It is called once per restore and per Client, on
	// the goroutine of the request that met the restore.
	OnRestored func(Restore)
}

// Restore is a session restored from its latest snapshot under a new id,
// its host having been lost.
type Restore struct {
	// From is the session's old id, To its new one.
	From, To string
	// Summary says what came back: "from snapshot snap-...: files exact
	// (3 files); variables restored: df, model; not restorable: conn
	// (...)". Work done after that snapshot is not in it.
	Summary string
}

// Client calls one sandloop server. It is safe for concurrent use.
type Client struct {
	base       *url.URL
	token      string
	hc         *http.Client
	onRestored func(Restore)

	mu       sync.Mutex
	restored map[string]string // old session id → the id it was restored as
}

// defaultHTTPClient keeps more idle connections per host than
// http.DefaultTransport's 2, so many goroutines sharing one Client do not
// open a new connection per request.
var defaultHTTPClient = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: t}
}()

// New returns a client of the server at baseURL (for example
// "http://127.0.0.1:8080").
func New(baseURL string, opts *Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("client: base URL %q: %w", baseURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q: want http://HOST:PORT or https://HOST:PORT", baseURL)
	}
	if opts == nil {
		opts = &Options{}
	}
	c := &Client{base: u, token: opts.Token, onRestored: opts.OnRestored, restored: map[string]string{}}
	hc := opts.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient
	}
	// A copy of it that notes the restores it is redirected to (restore.go).
	c.hc = new(http.Client)
	*c.hc = *hc
	c.hc.CheckRedirect = c.checkRedirect(hc.CheckRedirect)
	return c, nil
}

// APIError is an error reported by the server.
type APIError struct {
	// StatusCode is the HTTP status, or 0 when the error came as a
	// "fatal" event in an execution stream that had already started.
	StatusCode int
	// Code is the server's stable error code ("not_found",
	// "too_many_sessions", "bad_path", ...); empty if the body was not a
	// sandloop error.
	Code string
	// Message says what went wrong and, often, what to do.
	Message string
	// RetryAfter is the server's Retry-After (with 429), or zero.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.StatusCode == 0 {
		return fmt.Sprintf("sandloop: %s: %s", e.Code, e.Message)
	}
	if e.Code == "" {
		return fmt.Sprintf("sandloop: HTTP %d: %s", e.StatusCode, e.Message)
	}
	return fmt.Sprintf("sandloop: HTTP %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// IsNotFound reports whether err is the server saying that the session
// (or file) does not exist, or belongs to another token.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// apiErrorFrom builds the error of a non-2xx response, reading (a bounded
// part of) its body.
func apiErrorFrom(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ae := &APIError{StatusCode: resp.StatusCode}
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && e.Error.Code != "" {
		ae.Code, ae.Message = e.Error.Code, e.Error.Message
	} else {
		ae.Message = strings.TrimSpace(string(body))
		if ae.Message == "" {
			ae.Message = http.StatusText(resp.StatusCode)
		}
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			ae.RetryAfter = time.Duration(n) * time.Second
		} else if t, err := http.ParseTime(s); err == nil {
			ae.RetryAfter = max(time.Until(t), 0)
		}
	}
	return ae
}

// endpoint joins the base URL with an already escaped path and a query.
func (c *Client) endpoint(escapedPath string, q url.Values) string {
	u := *c.base
	u.RawPath = c.base.EscapedPath() + escapedPath
	u.Path, _ = url.PathUnescape(u.RawPath)
	u.RawQuery = q.Encode()
	return u.String()
}

// sessionPath is /v1/sessions/{id} followed by suffix (already escaped),
// under the id session id was restored as, if it was.
func (c *Client) sessionPath(id, suffix string) string {
	return "/v1/sessions/" + url.PathEscape(c.SessionID(id)) + suffix
}

// filePath escapes a workspace path segment by segment, so "/" keeps
// separating directories and nothing else is special. It refuses ".."
// segments: the server never lets a path out of the workspace, but its
// router would clean them out of the URL before that check and answer a
// puzzling 404 or redirect.
func filePath(p string) (string, error) {
	parts := strings.Split(strings.TrimLeft(p, "/"), "/")
	for i, s := range parts {
		if s == ".." {
			return "", fmt.Errorf("sandloop: path %q: \"..\" is not allowed (paths are relative to /workspace)", p)
		}
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/"), nil
}

// request sends one request and returns the response when its status is
// 2xx; otherwise it returns the *APIError.
func (c *Client) request(ctx context.Context, method, escapedPath string, q url.Values, body io.Reader, contentType string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.endpoint(escapedPath, q), body)
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if req.Body != nil && req.GetBody == nil {
		replayable(req, body) // a redirect to a restored session sends it again
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, apiErrorFrom(resp)
	}
	return resp, nil
}

// doJSON sends in (if not nil) as JSON and decodes the response into out
// (if not nil).
func (c *Client) doJSON(ctx context.Context, method, escapedPath string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.request(ctx, method, escapedPath, q, body, ct, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("sandloop: decode %s %s response: %w", method, escapedPath, err)
	}
	return nil
}

// Health is the server's /healthz.
type Health struct {
	Status string `json:"status"`
	// Sessions is how many sessions the server holds.
	Sessions int `json:"sessions"`
	// PoolReady is how many started kernels wait in the warm pool.
	PoolReady int `json:"pool_ready"`
	// PoolTarget is how many kernels the warm pool keeps ready now: it
	// grows with the arrival rate and with the largest burst of creates
	// seen in the last minutes. PoolReason says why it is what it is.
	PoolTarget int    `json:"pool_target"`
	PoolReason string `json:"pool_reason,omitempty"`
	// SparesReady is how many of the zygote's forked spares wait for a
	// session (0 without a zygote): with PoolReady, how many sessions
	// would start without waiting for a fork.
	SparesReady int `json:"spares_ready"`
	// Starting is how many creates are under way (in line for a pooled
	// kernel or starting one); each holds one of MaxSessions' slots.
	Starting int `json:"starting"`
	// MaxSessions is the server's cap on sessions held at once.
	MaxSessions int `json:"max_sessions"`
}

// Health returns the server's health and gauges.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}
