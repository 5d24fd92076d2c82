package session

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/zygote"
)

// echoServer starts, in the session's kernel, a line server on port that
// answers "PORT:line" (so an answer says which server gave it).
func echoServer(t *testing.T, s *Session, port int) {
	t.Helper()
	mustOK(t, runCode(t, s, fmt.Sprintf(`
import socket, threading
def serve(srv):
    while True:
        c, _ = srv.accept()
        f = c.makefile("rwb")
        f.write(b"%d:" + f.readline()); f.flush(); c.close()
srv = socket.create_server(("127.0.0.1", %d))
threading.Thread(target=serve, args=(srv,), daemon=True).start()`, port, port)))
}

func ask(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, line+"\n")
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return strings.TrimSpace(got)
}

// A session's ports are its own loopback's: the host reaches a server its
// code started, a sibling's server on the same port stays the sibling's,
// and a port the host itself listens on is never reached through a
// session (refused, as nothing listens there inside the sandbox).
func TestDialPortReachesOnlyTheSessionsLoopback(t *testing.T) {
	// A server of the host's own, on its loopback.
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HOST\n")
			c.Close()
		}
	}()
	hostPort := host.Addr().(*net.TCPAddr).Port

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
			a, b := newSession(t, opts), newSession(t, opts)
			if _, forked := a.proc.(*zygote.Process); forked != (name == "zygote") {
				t.Fatalf("%s session's kernel is %T", name, a.proc)
			}
			echoServer(t, a, 7000)
			echoServer(t, b, 7000+1)
			ctx := context.Background()
			c, err := a.DialPort(ctx, 7000)
			if err != nil {
				t.Fatal(err)
			}
			if got := ask(t, c, "hi"); got != "7000:hi" {
				t.Errorf("a's server: %q", got)
			}
			// b's server is not on a's loopback.
			if _, err := a.DialPort(ctx, 7001); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("a's port 7001 (b's server): %v, want connection refused", err)
			}
			if ports, err := b.Ports(); err != nil || !slices.Equal(ports, []int{7001}) {
				t.Errorf("b's ports: %v %v, want [7001]", ports, err)
			}
			// The host's own server is not on any session's loopback.
			if c, err := a.DialPort(ctx, hostPort); err == nil {
				got, _ := bufio.NewReader(c).ReadString('\n')
				c.Close()
				t.Fatalf("the host's port %d reached through a session: %q", hostPort, got)
			} else if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("host port: %v, want connection refused", err)
			}
			if _, err := a.DialPort(ctx, 0); err == nil {
				t.Error("port 0 accepted")
			}
			// After the session ends its ports are gone, never another's.
			a.Close()
			if _, err := a.DialPort(ctx, 7000); err == nil {
				t.Error("a closed session's port still reached")
			}
		})
	}
}

// A session on the host's network has no ports of its own to offer.
func TestDialPortRefusedOnHostNetwork(t *testing.T) {
	s := newSession(t, Options{Network: jail.NetworkHost})
	if _, err := s.DialPort(context.Background(), 8000); !errors.Is(err, jail.ErrNoOwnNetwork) {
		t.Errorf("DialPort on the host's network: %v, want ErrNoOwnNetwork", err)
	}
}

// Once the kernel has died its sandbox is gone with it: no port is
// listed (not an error about a process), and a dial says the session
// needs a restart; after one, its ports are reached again.
func TestPortsOfADeadKernel(t *testing.T) {
	s := newSession(t, Options{})
	echoServer(t, s, 8125)
	if ports, err := s.Ports(); err != nil || !slices.Contains(ports, 8125) {
		t.Fatalf("ports %v, %v: want 8125", ports, err)
	}
	runCode(t, s, "import os\nos._exit(3)")
	if ports, err := s.Ports(); err != nil || len(ports) != 0 {
		t.Errorf("a dead kernel's ports: %v, %v; want none, no error", ports, err)
	}
	if _, err := s.DialPort(context.Background(), 8125); !errors.Is(err, ErrRestartRequired) {
		t.Errorf("a dial into a dead kernel's sandbox: %v, want ErrRestartRequired", err)
	}
	if err := s.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	echoServer(t, s, 8125)
	c, err := s.DialPort(context.Background(), 8125)
	if err != nil {
		t.Fatal(err)
	}
	if got := ask(t, c, "hi"); got != "8125:hi" {
		t.Errorf("after the restart: %q", got)
	}
}
