package jail

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// A program that ends while its caller still holds stdin open is reported
// as ended: the jail does not wait for the caller's reader (E2B's
// `stdin: true`, where the client may never close it).
func TestEndNotHeldByOpenStdin(t *testing.T) {
	for _, tc := range []struct {
		name, code, input, want string
	}{
		{"never reads", "print('bye')", "", "bye"},
		{"reads one line", "print(input().upper())", "hi\n", "HI"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			defer pw.Close()
			var out bytes.Buffer
			p, err := Start(context.Background(), &Config{Path: DefaultPython, Args: []string{"python3", "-c", tc.code},
				Workspace: testWorkspace(t), Stdin: pr, Stdout: &out, Limits: Limits{Timeout: time.Minute}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.input != "" {
				go pw.Write([]byte(tc.input))
			}
			type waited struct {
				r   *Result
				err error
			}
			done := make(chan waited, 1)
			go func() { r, err := p.Wait(); done <- waited{r, err} }()
			select {
			case w := <-done:
				if w.err != nil || w.r.ExitCode != 0 || w.r.TimedOut {
					t.Fatalf("Wait: %+v, %v", w.r, w.err)
				}
			case <-time.After(30 * time.Second):
				p.Kill()
				t.Fatal("the program ended but Wait did not return while stdin stayed open")
			}
			if got := strings.TrimSpace(out.String()); got != tc.want {
				t.Errorf("stdout %q, want %q", got, tc.want)
			}
			// The caller's writes now fail instead of blocking forever.
			pw.Close()
		})
	}
}

// Kill ends a program blocked reading an open stdin, and Wait returns.
func TestKillWithOpenStdin(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	p, err := Start(context.Background(), &Config{Path: "/bin/cat", Args: []string{"cat"},
		Workspace: testWorkspace(t), Stdin: pr, Limits: Limits{Timeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	select {
	case <-waitDone(p):
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return after Kill while stdin stayed open")
	}
	if r, _ := p.Wait(); r == nil || r.Signal != "SIGKILL" {
		t.Errorf("result %+v, want killed", r)
	}
}

func waitDone(p *Process) <-chan struct{} {
	ch := make(chan struct{})
	go func() { p.Wait(); close(ch) }()
	return ch
}
