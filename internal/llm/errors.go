package llm

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// AuthError is a rejected credential (HTTP 401 or 403). It names the setting to fix.
type AuthError struct {
	Provider   string
	StatusCode int
	// EnvVar is the environment variable the key is read from, e.g. "OPENAI_API_KEY".
	EnvVar  string
	Message string // the server's explanation, if any
	Err     error  // the SDK's error
}

func (e *AuthError) Error() string {
	what := "rejected the API key"
	if e.StatusCode == http.StatusForbidden {
		what = "refused access with this API key"
	}
	s := fmt.Sprintf("%s %s (HTTP %d)", e.Provider, what, e.StatusCode)
	if e.EnvVar != "" {
		s += ": check " + e.EnvVar
	}
	if e.Message != "" {
		s += " (server said: " + e.Message + ")"
	}
	return s
}

func (e *AuthError) Unwrap() error { return e.Err }

// ModelNotFoundError is an unknown model (HTTP 404).
type ModelNotFoundError struct {
	Provider string
	Model    string
	// BaseURL is set for servers other than the provider's own, where a 404 may also
	// mean the base URL lacks its /v1.
	BaseURL string
	Message string
	Err     error
}

func (e *ModelNotFoundError) Error() string {
	s := fmt.Sprintf("%s: unknown model %q (HTTP 404)", e.Provider, e.Model)
	switch {
	case e.Provider == "ollama":
		s += fmt.Sprintf("; pull it first: ollama pull %s", e.Model)
	case e.BaseURL != "" && e.Provider == "anthropic":
		s += fmt.Sprintf(" at %s; check the model name and the base URL", e.BaseURL)
	case e.BaseURL != "":
		s += fmt.Sprintf(" at %s; check the model name, and that the base URL ends in /v1", e.BaseURL)
	default:
		s += "; check --model or SANDLOOP_MODEL"
	}
	if e.Message != "" {
		s += " (server said: " + e.Message + ")"
	}
	return s
}

func (e *ModelNotFoundError) Unwrap() error { return e.Err }

// APIError is any other error status from the provider, including 429 and 5xx once
// retries are used up.
type APIError struct {
	Provider   string
	StatusCode int
	Message    string
	// InStream marks an error that arrived inside a stream that had started fine
	// (StatusCode is then what the error type stands for, or 0 if unknown).
	InStream bool
	// RetryAfter is what the server asked for (Retry-After), if it did.
	RetryAfter    time.Duration
	hasRetryAfter bool
	// Hint says what to check when the status points at the configuration rather
	// than the server (a 405 or 501 from a compatible server: a wrong base URL).
	Hint string
	Err  error
}

func (e *APIError) Error() string {
	var s string
	switch {
	case e.InStream:
		s = fmt.Sprintf("%s: error in the response stream", e.Provider)
	default:
		s = fmt.Sprintf("%s: HTTP %d %s", e.Provider, e.StatusCode, http.StatusText(e.StatusCode))
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.hasRetryAfter {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

func (e *APIError) Unwrap() error { return e.Err }

// Temporary reports whether trying again later may succeed (rate limits, overload,
// server errors). 408 and 409 are included as the official SDKs retry them too. An
// error inside a stream without a known status is taken as a server hiccup.
func (e *APIError) Temporary() bool {
	switch {
	case e.InStream && e.StatusCode == 0:
		return true
	case e.StatusCode == http.StatusTooManyRequests,
		e.StatusCode == http.StatusRequestTimeout,
		e.StatusCode == http.StatusConflict,
		e.StatusCode >= 500 && e.StatusCode != http.StatusNotImplemented && e.StatusCode != http.StatusHTTPVersionNotSupported:
		// 501 and 505 say the server does not do this request at all: asking again
		// gets the same answer.
		return true
	}
	return false
}

// RetryError wraps the last error of a call that was tried more than once.
type RetryError struct {
	Attempts int
	Err      error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%v (gave up after %d attempts)", e.Err, e.Attempts)
}

func (e *RetryError) Unwrap() error { return e.Err }

// statusError is what the adapters extract from an SDK error.
type statusError struct {
	status  int
	header  http.Header
	message string
}

// classify turns an HTTP error status into one of this package's errors.
func classify(provider, model, baseURL, envVar string, se statusError, err error) error {
	switch se.status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return &AuthError{Provider: provider, StatusCode: se.status, EnvVar: envVar, Message: se.message, Err: err}
	case http.StatusNotFound:
		return &ModelNotFoundError{Provider: provider, Model: model, BaseURL: baseURL, Message: se.message, Err: err}
	}
	ra, ok := retryAfter(se.header, time.Now())
	apiErr := &APIError{Provider: provider, StatusCode: se.status, Message: se.message, RetryAfter: ra, hasRetryAfter: ok, Err: err}
	if baseURL != "" && (se.status == http.StatusMethodNotAllowed || se.status == http.StatusNotImplemented) {
		apiErr.Hint = "check the base URL " + baseURL
		if provider != "anthropic" {
			apiErr.Hint += " (it usually ends in /v1)"
		}
	}
	return apiErr
}

// ConnectError is a model server that refused the connection: nothing listens at
// the configured address.
type ConnectError struct {
	Provider string
	// Setting is where the address comes from, e.g. "OPENAI_BASE_URL"; empty for a
	// provider's own API.
	Setting string
	Addr    string // host:port
	Err     error
}

func (e *ConnectError) Error() string {
	s := e.Provider + ": nothing is listening at "
	if e.Setting != "" {
		s += e.Setting + " (" + e.Addr + ")"
	} else {
		s += e.Addr
	}
	if e.Provider == "ollama" {
		return s + ": is Ollama running (ollama serve)?"
	}
	return s + ": is the model server running?"
}

func (e *ConnectError) Unwrap() error { return e.Err }

// connectError describes a refused connection to base, or returns nil if err is
// not one.
func connectError(provider, setting, base string, err error) error {
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	addr := base
	if u, perr := url.Parse(base); perr == nil && u.Host != "" {
		addr = u.Host
	}
	return &ConnectError{Provider: provider, Setting: setting, Addr: addr, Err: err}
}

// retryAfter reads retry-after-ms (OpenAI, Anthropic) or Retry-After (seconds or an HTTP date).
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	if v := strings.TrimSpace(h.Get("Retry-After-Ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s > 1e9 {
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		d := t.Sub(now)
		if d < 0 {
			d = 0
		}
		return d, true
	}
	return 0, false
}

// errorMessage shortens a server message so one bad response cannot flood a log line.
func errorMessage(s string) string {
	s = strings.TrimSpace(s)
	const max = 500
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

var errNoChoices = errors.New("the response has no choices")
