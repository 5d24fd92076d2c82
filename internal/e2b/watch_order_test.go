//go:build linux

package e2b

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/workspace"
)

// A directory is watched before its creation is reported: a client that
// writes in it as soon as it hears of it sees what it wrote, whether the
// watcher learnt of the directory from its own event (a) or found it
// while following a new parent (p/q: made, with its parent, while the
// watcher was held up). Each time the write is made and undone inside
// deliver, before the watcher goes on, so a watch added after the report
// would miss it.
func TestWatchedBeforeReported(t *testing.T) {
	dir := t.TempDir()
	ws, err := workspace.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var (
		mu   sync.Mutex
		got  []string
		hold = make(chan struct{})
	)
	touch := func(name string) {
		p := filepath.Join(dir, name, "f")
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Error(err)
		}
		os.Remove(p)
	}
	w, err := watchDir(ws, ".", true, 100, func(ev fsEvent) bool {
		mu.Lock()
		got = append(got, string(ev.Type)[len("EVENT_TYPE_"):]+" "+ev.Name)
		mu.Unlock()
		switch {
		case ev.Type == eventCreate && ev.Name == "hold":
			<-hold
		case ev.Type == eventCreate && (ev.Name == "a" || ev.Name == "p/q"):
			touch(ev.Name)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()

	os.Mkdir(filepath.Join(dir, "a"), 0o755)
	os.WriteFile(filepath.Join(dir, "hold"), nil, 0o644)
	testutil.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if !slices.Contains(got, "CREATE hold") {
			return os.ErrNotExist
		}
		return nil
	})
	// The watcher waits in deliver: p/q exists before p is watched.
	os.MkdirAll(filepath.Join(dir, "p", "q"), 0o755)
	close(hold)
	want := []string{"CREATE a", "CREATE a/f", "REMOVE a/f", "CREATE p", "CREATE p/q", "CREATE p/q/f", "REMOVE p/q/f"}
	testutil.WaitFor(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		var seen []string
		for _, g := range got {
			if slices.Contains(want, g) && !slices.Contains(seen, g) {
				seen = append(seen, g)
			}
		}
		if !slices.Equal(seen, want) {
			return fmt.Errorf("events %q, want %q in this order", got, want)
		}
		return nil
	})
}
