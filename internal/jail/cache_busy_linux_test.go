package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// A program written to the cache is executed at once while other
// goroutines fork: never "text file busy" (a child forked while the file
// was open for writing held its descriptor until its own exec).
func TestCachedProgramNotBusyWhileForking(t *testing.T) {
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for !stop.Load() {
				_ = exec.Command("/bin/true").Run()
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	busy := 0
	for i := range 300 {
		path := filepath.Join(dir, fmt.Sprintf("sandloop-busy-%04d", i))
		if err := ensureCached(path, func() ([]byte, error) { return bin, nil }); err != nil {
			t.Fatal(err)
		}
		if err := exec.Command(path).Run(); errors.Is(err, syscall.ETXTBSY) {
			busy++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if busy > 0 {
		t.Errorf("%d of 300 programs just written were busy when executed", busy)
	}
}
