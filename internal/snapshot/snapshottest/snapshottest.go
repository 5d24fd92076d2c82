// Package snapshottest gives tests a snapshot store of their own.
package snapshottest

import (
	"testing"

	"github.com/sandloop/sandloop/internal/snapshot"
)

// Dir is a snapshot store, with the defaults, in a temporary directory
// of the test's (removed after it).
func Dir(t testing.TB) *snapshot.Store {
	t.Helper()
	d, err := snapshot.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.New(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
