// Package pgtest starts a throwaway PostgreSQL server for tests: Debian's
// postgresql package (scripts/deps.sh installs it), a new cluster in a temp
// dir, listening on 127.0.0.1 at a free port. PostgreSQL refuses to run as
// root, so when the test runs as root the cluster runs as the postgres user
// (runuser). Everything is stopped and removed in the test's cleanup.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server is a running PostgreSQL cluster.
type Server struct {
	t       testing.TB
	bin     string // directory of initdb, pg_ctl
	dir     string // owns data/ and the socket
	port    int
	asUser  string // "" when we are not root
	stopped bool
}

// bindir finds the newest installed PostgreSQL's programs.
func bindir() (string, error) {
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(found) == 0 {
		return "", fmt.Errorf("PostgreSQL is not installed (run scripts/deps.sh, which installs Debian's postgresql)")
	}
	sort.Slice(found, func(i, j int) bool { return version(found[i]) > version(found[j]) })
	return filepath.Dir(found[0]), nil
}

func version(pgctl string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(pgctl))))
	return v
}

// Start initialises and starts a cluster; t's cleanup stops it and removes
// its files. It fails the test if PostgreSQL cannot start.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := bindir()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, bin: bin}
	if os.Geteuid() == 0 {
		s.asUser = "postgres"
	}
	// Not t.TempDir: its parents are private to root, and the server runs as postgres.
	dir, err := os.MkdirTemp("", "sandloop-pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() {
		s.stop("immediate")
		os.RemoveAll(dir)
	})
	if s.asUser != "" {
		u, err := user.Lookup(s.asUser)
		if err != nil {
			t.Fatalf("PostgreSQL refuses to run as root and there is no %s user: %v (install Debian's postgresql)", s.asUser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	s.port = freePort(t)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *Server) data() string { return filepath.Join(s.dir, "data") }

// run runs one of PostgreSQL's programs as the cluster's user.
func (s *Server) run(prog string, args ...string) ([]byte, error) {
	path := filepath.Join(s.bin, prog)
	var cmd *exec.Cmd
	if s.asUser != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.asUser, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// Start starts the (stopped) server again on the same port and waits
// until it accepts connections.
func (s *Server) Start() error {
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300", s.port, s.dir)
	if out, err := s.run("pg_ctl", "start", "-w", "-t", "60", "-D", s.data(), "-l", filepath.Join(s.dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		return fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	s.stopped = false
	return nil
}

// Stop stops the server (fast shutdown: connections are cut).
func (s *Server) Stop() { s.stop("fast") }

func (s *Server) stop(mode string) {
	if s.stopped {
		return
	}
	pid := s.PID()
	if out, err := s.run("pg_ctl", "stop", "-w", "-m", mode, "-D", s.data()); err != nil && pid > 0 {
		s.t.Logf("pg_ctl stop: %v\n%s; killing postmaster %d", err, out, pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	s.stopped = true
}

// PID is the postmaster's process id, or 0 if it is not running.
func (s *Server) PID() int {
	b, err := os.ReadFile(filepath.Join(s.data(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// URL is the address of database db on this server.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, db)
}

// NewDatabase creates an empty database and returns its URL.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return s.URL(name)
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
