package store

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// BenchmarkAppendEvent measures one event append (a write transaction each), the
// store's hottest path while a run streams output.
func BenchmarkAppendEvent(b *testing.B) {
	s, err := Open(b.Context(), filepath.Join(b.TempDir(), "runs.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	r, err := s.CreateRun(b.Context(), Run{Task: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	data := json.RawMessage(`{"type":"stdout","text":"hello world\n"}`)
	for b.Loop() {
		if _, err := s.AppendEvent(b.Context(), r.ID, "stdout", data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendEvents100 appends events in batches of 100; compare its ns/op with
// 100 times BenchmarkAppendEvent's.
func BenchmarkAppendEvents100(b *testing.B) {
	s, err := Open(b.Context(), filepath.Join(b.TempDir(), "runs.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	r, err := s.CreateRun(b.Context(), Run{Task: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	batch := make([]Event, 100)
	for i := range batch {
		batch[i] = Event{Type: "stdout", Data: json.RawMessage(`{"type":"stdout","text":"hello world\n"}`)}
	}
	for b.Loop() {
		if _, err := s.AppendEvents(b.Context(), r.ID, batch); err != nil {
			b.Fatal(err)
		}
	}
}
