package kernel

import (
	"encoding/json"
	"time"
)

// Status says how an execution ended.
type Status string

const (
	StatusOK          Status = "ok"          // the code ran to the end
	StatusError       Status = "error"       // the code raised
	StatusTimeout     Status = "timeout"     // the execution timed out and was interrupted; state survives
	StatusInterrupted Status = "interrupted" // the execution was interrupted on request; state survives
	StatusKilled      Status = "killed"      // the kernel died or was killed; the session must restart
)

// Event types, as in DESIGN.md ("Execution events").
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventResult = "result"
	EventError  = "error"
	EventEnd    = "end"
)

// Event is one item of an execution's stream. Which fields are set depends
// on Type; MarshalJSON writes exactly the fields of that type.
type Event struct {
	Type string `json:"type"`

	// stdout, stderr
	Text string `json:"text,omitempty"`

	// result
	IsMainResult bool              `json:"is_main_result,omitempty"`
	Data         map[string]string `json:"data,omitempty"` // MIME type → text; base64 for images

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
}

// EventFunc receives the events of an execution as they happen, in order,
// on the goroutine that called Execute.
type EventFunc func(Event)

// MarshalJSON writes the fields that belong to the event's type, zero values
// included, so each type always has the same shape.
func (e Event) MarshalJSON() ([]byte, error) {
	switch e.Type {
	case EventStdout, EventStderr:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{e.Type, e.Text})
	case EventResult:
		data := e.Data
		if data == nil {
			data = map[string]string{}
		}
		return json.Marshal(struct {
			Type         string            `json:"type"`
			IsMainResult bool              `json:"is_main_result"`
			Data         map[string]string `json:"data"`
		}{e.Type, e.IsMainResult, data})
	case EventError:
		return json.Marshal(struct {
			Type      string `json:"type"`
			Name      string `json:"name"`
			Value     string `json:"value"`
			Traceback string `json:"traceback"`
		}{e.Type, e.Name, e.Value, e.Traceback})
	case EventEnd:
		return json.Marshal(struct {
			Type            string  `json:"type"`
			Status          Status  `json:"status"`
			ExecutionCount  int     `json:"execution_count"`
			DurationMS      float64 `json:"duration_ms"`
			CPUMS           float64 `json:"cpu_ms"`
			MemoryPeakBytes int64   `json:"memory_peak_bytes"`
		}{e.Type, e.Status, e.ExecutionCount, e.DurationMS, e.CPUMS, e.MemoryPeakBytes})
	}
	type plain Event // no MarshalJSON: avoids recursion
	return json.Marshal(plain(e))
}

// Request is one execution.
type Request struct {
	// Code is the cell's source. Lines starting with "!" run as shell commands.
	Code string `json:"code"`
	// Timeout bounds the execution's wall-clock time; when it passes the
	// code is interrupted (status "timeout"). If zero, no timeout beyond
	// the caller's context.
	Timeout time.Duration `json:"-"`
	// Env holds environment variables set for this execution only.
	Env map[string]string `json:"env,omitempty"`
}

// Output is a displayed value: the cell's final expression (IsMainResult)
// or an object passed to display() or a figure.
type Output struct {
	IsMainResult bool              `json:"is_main_result"`
	Data         map[string]string `json:"data"`
}

// Exception describes the error that ended an execution.
type Exception struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Result aggregates the events of one execution.
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
	// Truncated reports that stdout or stderr exceeded the capture limit:
	// the middle was dropped, keeping the head and the tail.
	Truncated bool `json:"truncated"`
}

// MainResult returns the data of the cell's final expression, or nil.
func (r *Result) MainResult() map[string]string {
	for _, o := range r.Results {
		if o.IsMainResult {
			return o.Data
		}
	}
	return nil
}
