package main

import (
	"bytes"
	"context"
	"image"
	_ "image/png"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// watchWriter collects output and closes seen once it contains want.
type watchWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.want != "" && strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestRepl(t *testing.T) {
	inR, inW := io.Pipe()
	out := &watchWriter{want: "sleeping", seen: make(chan struct{})}
	errOut := &watchWriter{}
	sigs := make(chan os.Signal, 1)
	images := t.TempDir()
	done := make(chan error, 1)
	go func() {
		done <- runRepl(context.Background(), replConfig{In: inR, Out: out, Err: errOut, Interrupts: sigs, Images: images})
	}()
	// The input is typed from another goroutine, so a repl that ends early
	// fails the test instead of leaving the writes blocked.
	go func() {
		io.WriteString(inW, "x = 21\ndef double(n):\n    return n * 2\n\ndouble(x)\n")
		io.WriteString(inW, "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(2, 1), dpi=50); plt.plot([1, 2]); plt.show()\n")
		io.WriteString(inW, "1/0\n!echo from shell\n")
		io.WriteString(inW, "import time\nprint('sleeping', flush=True); time.sleep(60)\n")
	}()
	select {
	case <-out.seen:
	case err := <-done:
		inR.CloseWithError(io.ErrClosedPipe)
		t.Fatalf("the repl ended before the sleeping cell ran: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	sigs <- os.Interrupt // Ctrl-C while the cell runs
	go func() {
		io.WriteString(inW, "print('x is', x)\n")
		inW.Close()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	o, e := out.String(), errOut.String()
	for _, want := range []string{"42\n", "from shell\n", "x is 21\n", "... "} {
		if !strings.Contains(o, want) {
			t.Errorf("stdout lacks %q:\n%s", want, o)
		}
	}
	for _, want := range []string{"ZeroDivisionError", "KeyboardInterrupt", "[interrupted; state kept]"} {
		if !strings.Contains(e, want) {
			t.Errorf("stderr lacks %q:\n%s", want, e)
		}
	}
	m := regexp.MustCompile(`\[image: (\S+)\]`).FindStringSubmatch(o)
	if m == nil {
		t.Fatalf("no image path printed:\n%s", o)
	}
	f, err := os.Open(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, _, err := image.DecodeConfig(f)
	if err != nil || cfg.Width != 100 || cfg.Height != 50 {
		t.Fatalf("saved image: %+v, %v; want a 100x50 PNG", cfg, err)
	}
}
