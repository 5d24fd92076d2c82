package llm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"syscall"
	"time"
)

// RetryPolicy says how calls are retried on 429, 5xx and dropped connections.
//
// The SDKs' own retries are switched off (option.WithMaxRetries(0)) so that both
// providers behave the same and the behaviour is this package's, tested here. A call
// is retried only before any streamed text reached the caller, so OnText never sees
// text twice.
type RetryPolicy struct {
	// MaxAttempts is the number of requests a call may make. If zero, 4; 1 disables retries.
	MaxAttempts int
	// BaseDelay is the first backoff; it doubles each attempt, with jitter. If zero, 1s.
	BaseDelay time.Duration
	// MaxDelay caps the backoff and the server's Retry-After. A Retry-After longer than
	// this ends the call at once with the *APIError, rather than hold a run for minutes.
	// If zero, 60s.
	MaxDelay time.Duration

	// sleep replaces the wait in tests so they can check delays without taking them.
	sleep func(ctx context.Context, d time.Duration) error
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 4
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = time.Second
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = 60 * time.Second
	}
	if p.sleep == nil {
		p.sleep = sleepCtx
	}
	return p
}

// delay returns how long to wait before attempt+1, and whether to try again at all.
func (p RetryPolicy) delay(attempt int, err error) (time.Duration, bool) {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		if !apiErr.Temporary() {
			return 0, false
		}
		if apiErr.hasRetryAfter {
			if apiErr.RetryAfter > p.MaxDelay {
				return 0, false
			}
			return apiErr.RetryAfter, true
		}
		return p.backoff(attempt), true
	}
	if transientNetError(err) {
		return p.backoff(attempt), true
	}
	return 0, false
}

// backoff is exponential with "equal jitter": half fixed, half random, so clients that
// failed together do not retry together.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	d := p.BaseDelay
	for i := 1; i < attempt && d < p.MaxDelay; i++ {
		d *= 2
	}
	d = min(d, p.MaxDelay)
	half := d / 2
	return half + rand.N(half+1)
}

// transientNetError reports a dropped or reset connection. A refused connection is not
// transient in practice (nothing listens: Ollama not started, wrong port) and retrying
// it only delays the clear error.
func transientNetError(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, syscall.ECONNRESET)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

// attemptFunc makes one request. emitted reports whether any text reached OnText,
// after which a retry would show the caller the same text twice.
type attemptFunc func(ctx context.Context) (resp *Response, emitted bool, err error)

// run makes the call, retrying as the policy says; req's OnAttempt and OnRetry
// hear of each attempt and each retry.
func (p RetryPolicy) run(ctx context.Context, log *slog.Logger, model string, req Request, call attemptFunc) (*Response, error) {
	p = p.withDefaults()
	for attempt := 1; ; attempt++ {
		if req.OnAttempt != nil {
			req.OnAttempt(attempt)
		}
		resp, emitted, err := call(ctx)
		if err == nil {
			resp.Attempts = attempt
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, ctxError(ctx, err)
		}
		d, again := p.delay(attempt, err)
		if !again || emitted || attempt >= p.MaxAttempts {
			if attempt > 1 {
				err = &RetryError{Attempts: attempt, Err: err}
			}
			return nil, err
		}
		log.WarnContext(ctx, "llm call failed, retrying", "model", model, "attempt", attempt, "delay", d, "err", err)
		if req.OnRetry != nil {
			req.OnRetry(newRetry(attempt+1, p.MaxAttempts, d, err))
		}
		if err := p.sleep(ctx, d); err != nil {
			return nil, ctxError(ctx, err)
		}
	}
}

// ctxError makes sure a call ended by its context says so to errors.Is, whatever the
// SDK wrapped the cancellation in.
func ctxError(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%v)", cause, err)
}

// RetryReason says why a call is retried.
type RetryReason string

const (
	RetryRateLimited RetryReason = "rate_limited" // HTTP 429
	RetryServerError RetryReason = "server_error" // 5xx, 409, or an error inside the stream
	RetryTimeout     RetryReason = "timeout"      // HTTP 408, or no answer in time
	RetryConnection  RetryReason = "connection"   // the connection dropped or was reset
)

// Retry describes a failed attempt that is about to be tried again.
type Retry struct {
	// Attempt is the attempt about to be made (2 for the first retry), of MaxAttempts.
	Attempt, MaxAttempts int
	// Delay is the wait before it.
	Delay  time.Duration
	Reason RetryReason
	// Status is the HTTP status that failed, or 0 (a dropped connection, an error
	// inside a stream without a status).
	Status int
	// Err is the attempt's error.
	Err error
}

func newRetry(attempt, maxAttempts int, d time.Duration, err error) Retry {
	r := Retry{Attempt: attempt, MaxAttempts: maxAttempts, Delay: d, Err: err, Reason: RetryConnection}
	var apiErr *APIError
	var ne net.Error
	switch {
	case errors.As(err, &apiErr):
		r.Status = apiErr.StatusCode
		switch apiErr.StatusCode {
		case http.StatusTooManyRequests:
			r.Reason = RetryRateLimited
		case http.StatusRequestTimeout:
			r.Reason = RetryTimeout
		default:
			r.Reason = RetryServerError
		}
	case errors.As(err, &ne) && ne.Timeout():
		r.Reason = RetryTimeout
	}
	return r
}

// String is the sentence a person reads, e.g. "rate limited by the model
// server, retrying in 2s (attempt 2/4)".
func (r Retry) String() string {
	var what string
	switch r.Reason {
	case RetryRateLimited:
		what = "rate limited by the model server"
	case RetryTimeout:
		what = "the model server did not answer in time"
		if r.Status != 0 {
			what = fmt.Sprintf("the model server timed out (HTTP %d)", r.Status)
		}
	case RetryServerError:
		what = "the model server failed in the middle of its answer"
		if r.Status != 0 {
			what = fmt.Sprintf("the model server answered %d", r.Status)
		}
	default:
		what = "the connection to the model server was lost"
	}
	when := "retrying now"
	if d := roundDelay(r.Delay); d > 0 {
		when = "retrying in " + d.String()
	}
	return fmt.Sprintf("%s, %s (attempt %d/%d)", what, when, r.Attempt, r.MaxAttempts)
}

// roundDelay keeps a jittered backoff readable: 1.734s is said as 1.7s, 734ms as 730ms.
func roundDelay(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
