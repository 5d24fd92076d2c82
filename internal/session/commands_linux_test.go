package session

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/testutil"
	"github.com/sandloop/sandloop/internal/workspace"
	"github.com/sandloop/sandloop/internal/zygote"
)

// A session is one sandbox: a server a command leaves running answers the
// kernel and the host's port route (previews), and the kernel, commands
// and the files API share /tmp; cold and forked sessions alike.
func TestCommandsShareTheSandbox(t *testing.T) {
	kinds := map[string]Options{"cold": {}}
	if zygote.Supported() == nil {
		z, err := zygote.New(context.Background(), &zygote.Options{Modules: []string{"json"}, Env: KernelEnv()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { z.Close() })
		kinds["zygote"] = Options{Zygote: z}
	}
	for name, opts := range kinds {
		t.Run(name, func(t *testing.T) {
			s := newSession(t, opts)
			var out bytes.Buffer
			p, err := s.StartCommand(context.Background(), Command{Path: "/bin/bash", Args: []string{"bash", "-c",
				"echo from-command > /tmp/c.txt; nohup python3 -m http.server 7100 --bind 127.0.0.1 >/dev/null 2>&1 & echo started"},
				Stdout: &out})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := p.Wait(); err != nil || r.ExitCode != 0 || out.String() != "started\n" {
				t.Fatalf("command: %+v %v %q", r, err, out.String())
			}
			mustOK(t, runCode(t, s, "open('index.html', 'w').write('hello from the workspace')"))
			r := runCode(t, s, `import time, urllib.request
for i in range(600):
    try:
        print(urllib.request.urlopen('http://127.0.0.1:7100/index.html', timeout=5).read().decode(), open('/tmp/c.txt').read().strip()); break
    except OSError:
        time.sleep(0.1)`)
			if strings.TrimSpace(r.Stdout) != "hello from the workspace from-command" {
				t.Fatalf("the kernel: %+v", r)
			}
			c, err := s.DialPort(context.Background(), 7100)
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(30 * time.Second))
			fmt.Fprintf(c, "GET /index.html HTTP/1.0\r\n\r\n")
			var resp bytes.Buffer
			resp.ReadFrom(c)
			c.Close()
			if !strings.HasPrefix(resp.String(), "HTTP/1.0 200") || !strings.HasSuffix(resp.String(), "hello from the workspace") {
				t.Errorf("the port route: %q", resp.String())
			}
			tmp, err := s.TmpFiles(workspace.Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := tmp.ReadFile("c.txt", 100)
			tmp.Close()
			if err != nil || string(b) != "from-command\n" {
				t.Errorf("/tmp through the files API: %q %v", b, err)
			}
			if len(testutil.PidsWithArg("http.server\x007100\x00")) == 0 {
				t.Fatal("the command's server is not seen from the host")
			}
			s.Close()
			testutil.WaitFor(t, 30*time.Second, func() error {
				if left := testutil.PidsWithArg("http.server\x007100\x00"); len(left) > 0 {
					return fmt.Errorf("the command's server %v outlived its session", left)
				}
				return nil
			})
		})
	}
}

// A session with small limits makes no join ahead (it would hold tasks
// and memory its programs miss); one with the defaults does, and its
// command starts in it.
func TestPrepareCommandLimits(t *testing.T) {
	small := newSession(t, Options{Limits: jail.Limits{Pids: 16}})
	if small.prepareCommand() != nil {
		t.Error("a join was made ahead in a session of 16 pids")
	}
	s := newSession(t, Options{})
	ready := s.prepareCommand()
	if ready == nil {
		t.Fatal("no join made ahead with the default limits")
	}
	<-ready
	var out bytes.Buffer
	p, err := s.StartCommand(context.Background(), Command{Path: "/bin/sh", Args: []string{"sh", "-c", "echo $PWD"}, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Wait(); err != nil || r.ExitCode != 0 || out.String() != "/workspace\n" || s.PreparedCommands() != 1 {
		t.Fatalf("command: %+v %v %q, %d in a join made ahead", r, err, out.String(), s.PreparedCommands())
	}
}
