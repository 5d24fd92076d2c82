package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Status says how an execution ended.
type Status string

const (
	StatusOK          Status = "ok"          // the code ran to the end
	StatusError       Status = "error"       // the code raised (see Result.Error)
	StatusTimeout     Status = "timeout"     // the code was interrupted by its timeout; state survives
	StatusInterrupted Status = "interrupted" // the code was interrupted on request; state survives
	StatusKilled      Status = "killed"      // the kernel died (OOM, ...); the session must be restarted
)

// Event types of an execution stream.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventResult = "result" // a displayed value: the last expression, display(), a figure
	EventError  = "error"  // the exception that ended the code
	EventEnd    = "end"    // always last
	// EventRestored comes first when the request woke the session from
	// hibernation (or restored it): Text says what came back and what
	// did not, as the Sandloop-Restored header does.
	EventRestored = "restored"
)

// Event is one item of an execution stream. Which fields are set depends
// on Type.
type Event struct {
	Type string `json:"type"`

	// stdout, stderr
	Text string `json:"text,omitempty"`

	// result: MIME type → content (base64 for images).
	IsMainResult bool              `json:"is_main_result,omitempty"`
	Data         map[string]string `json:"data,omitempty"`

	// error
	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`

	// end
	Status          Status  `json:"status,omitempty"`
	ExecutionCount  int     `json:"execution_count,omitempty"`
	DurationMS      float64 `json:"duration_ms,omitempty"`
	CPUMS           float64 `json:"cpu_ms,omitempty"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes,omitempty"`

	// fatal (turned into an *APIError, never passed to an EventFunc)
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// EventFunc receives the events of an execution as they arrive.
type EventFunc func(Event)

// Output is a displayed value.
type Output struct {
	IsMainResult bool              `json:"is_main_result"`
	Data         map[string]string `json:"data"`
}

// Exception is the error that ended an execution.
type Exception struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Result is the outcome of one execution.
type Result struct {
	Status          Status     `json:"status"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	Results         []Output   `json:"results"`
	Error           *Exception `json:"error"`
	ExecutionCount  int        `json:"execution_count"`
	DurationMS      float64    `json:"duration_ms"`
	CPUMS           float64    `json:"cpu_ms"`
	MemoryPeakBytes int64      `json:"memory_peak_bytes"`
	// Truncated reports that stdout or stderr exceeded the server's
	// capture limit and lost its middle. Only set by Execute.
	Truncated bool `json:"truncated"`
}

// MainResult returns the data of the cell's last expression, or nil.
func (r *Result) MainResult() map[string]string {
	for _, o := range r.Results {
		if o.IsMainResult {
			return o.Data
		}
	}
	return nil
}

// Text returns the text/plain form of the cell's last expression, or "".
func (r *Result) Text() string { return r.MainResult()["text/plain"] }

// ExecuteOptions tune one execution. A nil *ExecuteOptions means the defaults.
type ExecuteOptions struct {
	// TimeoutS bounds the execution, in seconds; when it passes the code
	// is interrupted (status "timeout"). If zero, the session's default.
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// Env holds environment variables for this execution only.
	Env map[string]string `json:"env,omitempty"`
}

type executeRequest struct {
	Code string `json:"code"`
	*ExecuteOptions
}

// Execute runs code in session id and returns the aggregated result.
// Globals persist between executions of a session.
func (c *Client) Execute(ctx context.Context, id, code string, opts *ExecuteOptions) (*Result, error) {
	var r Result
	if err := c.doJSON(ctx, http.MethodPost, c.sessionPath(id, "/execute"), nil, executeRequest{code, opts}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// ExecuteStream runs code in session id, calling fn (if not nil) with each
// event as it arrives, on the calling goroutine, and returns the result
// aggregated from the events. Keepalive events are not passed on. A
// "fatal" event (the server failed mid-stream) is returned as an
// *APIError with StatusCode 0. Canceling ctx disconnects, which interrupts
// the execution.
func (c *Client) ExecuteStream(ctx context.Context, id, code string, opts *ExecuteOptions, fn EventFunc) (*Result, error) {
	body, err := json.Marshal(executeRequest{code, opts})
	if err != nil {
		return nil, err
	}
	hdr := http.Header{"Accept": {"application/x-ndjson"}}
	resp, err := c.request(ctx, http.MethodPost, c.sessionPath(id, "/execute"), nil, strings.NewReader(string(body)), "application/json", hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/x-ndjson") {
		return nil, fmt.Errorf("sandloop: execute stream: the server answered %q, not NDJSON", ct)
	}
	res := &Result{Results: []Output{}}
	var stdout, stderr strings.Builder
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(strings.TrimSpace(string(line))) > 0 {
			var ev Event
			if jerr := json.Unmarshal(line, &ev); jerr != nil {
				return nil, fmt.Errorf("sandloop: execute stream: bad event %.200q: %w", line, jerr)
			}
			switch ev.Type {
			case "keepalive":
				continue
			case "fatal":
				return nil, &APIError{Code: ev.Code, Message: ev.Message}
			case EventStdout:
				stdout.WriteString(ev.Text)
			case EventStderr:
				stderr.WriteString(ev.Text)
			case EventResult:
				res.Results = append(res.Results, Output{IsMainResult: ev.IsMainResult, Data: ev.Data})
			case EventError:
				res.Error = &Exception{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
			case EventEnd:
				res.Status, res.ExecutionCount = ev.Status, ev.ExecutionCount
				res.DurationMS, res.CPUMS, res.MemoryPeakBytes = ev.DurationMS, ev.CPUMS, ev.MemoryPeakBytes
			}
			if fn != nil {
				fn(ev)
			}
			if ev.Type == EventEnd {
				res.Stdout, res.Stderr = stdout.String(), stderr.String()
				return res, nil
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return nil, fmt.Errorf("sandloop: execute stream ended before its end event: %w", err)
		}
	}
}
