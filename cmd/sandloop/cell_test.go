package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/store/pgtest"
)

// proc is a sandloop process of the cell test (this test binary).
type proc struct {
	name string
	args []string
	addr string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{}
	err  error
}

// tail is the last n lines of a process's log (syncBuffer, e2b_test.go),
// with how many came before.
func (s *syncBuffer) tail(n int) string {
	lines := strings.SplitAfter(s.String(), "\n")
	if len(lines) <= n {
		return strings.Join(lines, "")
	}
	return fmt.Sprintf("[%d lines before]\n", len(lines)-n) + strings.Join(lines[len(lines)-n:], "")
}

type cell struct {
	t *testing.T
	// cur and ctx are the running phase's test and deadline (phase):
	// requests carry ctx, waits end at its deadline.
	cur     *testing.T
	ctx     context.Context
	env     []string
	mu      sync.Mutex
	procs   []*proc
	token   string
	pg      *pgtest.Server
	db      string
	hosts   []*proc
	gws     []*proc
	secret  string
	hostCSV string
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs the sandloop command as a child and waits for its /healthz.
func (c *cell) start(name, addr string, args ...string) *proc {
	c.cur.Helper()
	p := &proc{name: name, addr: addr, args: args, log: &syncBuffer{}, done: make(chan struct{})}
	// This test binary runs as the CLI with SANDLOOP_CLI_CHILD (TestMain).
	p.cmd = exec.Command(os.Args[0])
	p.cmd.Env = append(os.Environ(), append(c.env, "SANDLOOP_CLI_CHILD="+strings.Join(append(args, "--addr", addr), "\x1f"))...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		c.cur.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	for {
		req, _ := http.NewRequestWithContext(c.ctx, "GET", "http://"+addr+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			c.cur.Fatalf("%s exited: %v\n%s", name, p.err, p.log.tail(40))
		case <-c.ctx.Done():
			c.cur.Fatalf("%s did not come up within the phase\n%s", name, p.log.tail(40))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *cell) startHost(i int, addr string) *proc {
	return c.start(fmt.Sprintf("host%d", i), addr, "serve", "--gateway-secret-file", c.secret, "--database", c.db,
		"--max-sessions", "70", "--pool", "1", "--drain-timeout", "60s", "--data-dir", c.t.TempDir())
}

func (c *cell) startGateway(i int, addr string) *proc {
	return c.start(fmt.Sprintf("gateway%d", i), addr, "gateway", "--gateway-secret-file", c.secret, "--database", c.db,
		"--hosts", c.hostCSV, "--token", c.token, "--health-interval", "200ms", "--lost-after", "5s", "--drain-timeout", "20s")
}

func (p *proc) signal(sig syscall.Signal) { p.cmd.Process.Signal(sig) }

func (p *proc) wait(c *cell) {
	c.cur.Helper()
	select {
	case <-p.done:
	case <-c.ctx.Done():
		c.cur.Fatalf("%s did not exit within the phase\n%s", p.name, p.log.tail(40))
	}
}

// request is a request through gw with the cell's token, bound to the phase.
func (c *cell) request(gw *proc, method, path string, body io.Reader) *http.Request {
	req, _ := http.NewRequestWithContext(c.ctx, method, "http://"+gw.addr+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	return req
}

// call sends a JSON request through a gateway and decodes the answer;
// 0 if it could not be sent or decoded (the phase's test says why).
func (c *cell) call(gw *proc, method, path string, body any, out any) int {
	c.cur.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req := c.request(gw, method, path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.cur.Errorf("%s %s via %s: %v", method, path, gw.name, err)
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.cur.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
			return 0
		}
	}
	return resp.StatusCode
}

type execResult struct {
	Status string `json:"status"`
	Stdout string `json:"stdout"`
	Error  *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (c *cell) exec(gw *proc, id, code string) (int, execResult) {
	var r execResult
	st := c.call(gw, "POST", "/v1/sessions/"+id+"/execute", map[string]any{"code": code}, &r)
	return st, r
}

// create makes a session through gw ("" if it could not: the phase fails).
func (c *cell) create(gw *proc) string {
	c.cur.Helper()
	var s struct {
		ID string `json:"id"`
	}
	if st := c.call(gw, "POST", "/v1/sessions", nil, &s); st != http.StatusCreated {
		c.cur.Errorf("create via %s: %d", gw.name, st)
		return ""
	}
	return s.ID
}

// hostOf reads the sessions table: which host holds id.
func (c *cell) hostOf(id string) string {
	c.cur.Helper()
	conn, err := pgx.Connect(c.ctx, c.db)
	if err != nil {
		c.cur.Fatal(err)
	}
	defer conn.Close(context.Background())
	var h string
	if err := conn.QueryRow(c.ctx, `SELECT host FROM sessions WHERE id = $1`, id).Scan(&h); err != nil {
		c.cur.Fatalf("session %q: %v", id, err)
	}
	return h
}

// newCell returns a cell whose processes are killed in t's cleanup (the
// tails of their logs shown if t failed).
func newCell(t *testing.T) *cell {
	c := &cell{t: t, cur: t, ctx: t.Context(), token: "cell-test-token-0123456789"}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, p := range c.procs {
			p.cmd.Process.Kill() // by PID: only what this test started
			<-p.done
			if t.Failed() {
				t.Logf("--- %s (%s) log, its end:\n%s", p.name, p.addr, p.log.tail(60))
			}
		}
	})
	return c
}

// phase runs one step of the cell's story as a subtest with its own
// deadline; the steps build on each other, so a failed one ends the test.
func (c *cell) phase(name string, d time.Duration, f func(t *testing.T)) {
	ok := c.t.Run(name, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		c.cur, c.ctx = t, ctx
		defer func() { c.cur, c.ctx = c.t, c.t.Context() }()
		f(t)
	})
	if !ok {
		c.t.FailNow()
	}
}

// TestCell runs a cell on this machine: PostgreSQL, 3 hosts and 2
// gateways as real processes with real jails, and checks what the cell
// promises: placement over all hosts, every kind of request through
// either gateway, 410 for the sessions of a killed host, rejoining with a
// new epoch, draining, a gateway restart and a PostgreSQL restart.
func TestCell(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 5 processes and 100 sandboxes")
	}
	c := newCell(t)
	llm := llmtest.NewOpenAIServer(t, llmtest.Script{
		{ToolCalls: tc("write_file", `{"path":"hello.py","content":"print('hi from the cell')\n"}`)},
		{ToolCalls: tc("run_shell", `{"command":"python3 hello.py"}`)},
		{ToolCalls: tc("finish", `{"summary":"hello.py greets"}`)},
	})
	c.env = []string{"SANDLOOP_MODEL=openai/gpt-4o-mini", "OPENAI_BASE_URL=" + llm.URL, "OPENAI_API_KEY=test-key", "ANTHROPIC_API_KEY=", "SANDLOOP_DATABASE_URL=", "SANDLOOP_TOKEN=", "SANDLOOP_GATEWAY_SECRET="}
	c.pg = pgtest.Start(t)
	c.db = c.pg.NewDatabase(t)
	c.secret = filepath.Join(t.TempDir(), "secret")
	os.WriteFile(c.secret, []byte("a-shared-secret-of-the-cell-0123456789abcdef\n"), 0o600)

	// The phases share what the cell holds.
	var (
		addrs    []string
		gwA, gwB *proc
		ids      []string
		perHost  map[string][]int
		victim   string // the host killed, then restarted
		drainer  string // the host drained
		live     string // a session on the third host
	)
	const n = 100

	c.phase("start", 3*time.Minute, func(t *testing.T) {
		for i := range 3 {
			addrs = append(addrs, freeAddr(t))
			c.hosts = append(c.hosts, c.startHost(i, addrs[i]))
		}
		c.hostCSV = "http://" + strings.Join(addrs, ",http://")
		c.gws = []*proc{c.startGateway(0, freeAddr(t)), c.startGateway(1, freeAddr(t))}
		gwA, gwB = c.gws[0], c.gws[1]
		c.waitFor("gateways see 3 ready hosts", func() bool {
			for _, gw := range c.gws {
				var h struct {
					Ready int `json:"hosts_ready"`
				}
				c.call(gw, "GET", "/healthz", nil, &h)
				if h.Ready != 3 {
					return false
				}
			}
			return true
		})
		// Hosts accept only the gateways.
		if resp, err := http.Post("http://"+addrs[0]+"/v1/sessions", "application/json", nil); err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a host answered a client directly: %v %v", resp.StatusCode, err)
		}
	})

	c.phase("placement", 4*time.Minute, func(t *testing.T) {
		// 100 sessions through both gateways, spread over all hosts.
		ids = make([]string, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				ids[i] = c.create(c.gws[i%2])
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		perHost = map[string][]int{}
		for i, id := range ids {
			h := c.hostOf(id)
			perHost[h] = append(perHost[h], i)
		}
		for h, is := range perHost {
			t.Logf("host %s holds %d sessions", h, len(is))
			if len(is) > n/2 {
				t.Errorf("host %s holds %d of %d sessions", h, len(is), n)
			}
		}
		if len(perHost) != 3 {
			t.Fatalf("sessions on %d hosts, want 3", len(perHost))
		}
		// State set through one gateway is read through the other.
		for i, id := range ids {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if st, r := c.exec(c.gws[i%2], id, fmt.Sprintf("x = %d", i)); st != 200 || r.Status != "ok" {
					t.Errorf("set x on %s: %d %+v", id, st, r)
				}
				if st, r := c.exec(c.gws[(i+1)%2], id, "print(x)"); st != 200 || r.Stdout != fmt.Sprintf("%d\n", i) {
					t.Errorf("read x on %s: %d %+v", id, st, r)
				}
			})
		}
		wg.Wait()
		// Sessions are per token, as on serve.
		var list struct {
			Sessions []json.RawMessage `json:"sessions"`
		}
		if st := c.call(gwB, "GET", "/v1/sessions", nil, &list); st != 200 || len(list.Sessions) < n {
			t.Errorf("list via B: %d, %d sessions", st, len(list.Sessions))
		}
	})

	c.phase("proxy", 3*time.Minute, func(t *testing.T) {
		c.checkFiles(t, gwA, gwB, ids[0])
		c.checkStreams(t, gwA, gwB, ids[1])
		c.checkMCP(t, gwB)
		c.checkRun(t, gwA, gwB)
	})

	var lost []string
	c.phase("host lost", 2*time.Minute, func(t *testing.T) {
		// kill -9 of a host mid-stream: its sessions answer 410 within
		// seconds; the others keep their state; new sessions go elsewhere.
		victim = c.hostOf(ids[2])
		vi := indexOf(addrs, victim)
		streamErr := make(chan error, 1)
		go func() {
			b, _ := json.Marshal(map[string]any{"code": "import time\nprint('streaming', flush=True)\ntime.sleep(60)"})
			req := c.request(gwA, "POST", "/v1/sessions/"+ids[2]+"/execute", bytes.NewReader(b))
			req.Header.Set("Accept", "application/x-ndjson")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				streamErr <- err
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			br.ReadString('\n')
			streamErr <- nil
			_, err = io.ReadAll(br)
			streamErr <- err
		}()
		if err := <-streamErr; err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		c.hosts[vi].signal(syscall.SIGKILL)
		select {
		case <-streamErr: // the stream ends (cut), it does not hang
		case <-time.After(30 * time.Second):
			t.Fatal("the stream of a killed host hangs")
		}
		for _, i := range perHost[victim] {
			lost = append(lost, ids[i])
		}
		c.waitFor("410 for the killed host's sessions", func() bool {
			st, r := c.exec(gwB, lost[0], "1")
			return st == http.StatusGone && r.Error != nil && r.Error.Code == "host_lost"
		})
		t.Logf("sessions of the killed host answer 410 after %v", time.Since(killed).Round(time.Millisecond))
		for _, id := range lost {
			if st, _ := c.exec(gwA, id, "1"); st != http.StatusGone {
				t.Errorf("lost session %s via A: %d, want 410", id, st)
			}
		}
		for h, is := range perHost {
			if h == victim {
				continue
			}
			for _, i := range is {
				if st, r := c.exec(c.gws[i%2], ids[i], "print(x)"); st != 200 || r.Stdout != fmt.Sprintf("%d\n", i) {
					t.Errorf("survivor %s: %d %+v", ids[i], st, r)
				}
			}
		}
		for range 4 {
			if h := c.hostOf(c.create(gwA)); h == victim {
				t.Errorf("a new session went to the killed host")
			}
		}
	})

	c.phase("rejoin", 2*time.Minute, func(t *testing.T) {
		// The host restarts on its address: a new epoch, old sessions stay
		// gone, new ones land on it again.
		vi := indexOf(addrs, victim)
		c.hosts[vi] = c.startHost(vi, victim)
		c.waitFor("the restarted host rejoins", func() bool {
			for range 3 {
				if c.hostOf(c.create(gwB)) == victim {
					return true
				}
			}
			return false
		})
		if st, _ := c.exec(gwB, lost[0], "1"); st != http.StatusGone {
			t.Errorf("a session of the old epoch answers %d after the restart, want 410", st)
		}
	})

	c.phase("drain", 2*time.Minute, func(t *testing.T) {
		// SIGTERM drains a host: no new sessions there, its open ones keep
		// working, and it exits once they are gone.
		for h := range perHost {
			if h != victim {
				drainer = h
				break
			}
		}
		di := indexOf(addrs, drainer)
		c.hosts[di].signal(syscall.SIGTERM)
		c.waitFor("the gateways see the host draining", func() bool {
			var hs struct {
				Hosts []struct {
					Name     string
					Draining bool
				}
			}
			c.call(gwA, "GET", "/v1/hosts", nil, &hs)
			for _, h := range hs.Hosts {
				if h.Name == drainer && h.Draining {
					return true
				}
			}
			return false
		})
		for range 4 {
			if h := c.hostOf(c.create(gwA)); h == drainer {
				t.Errorf("a new session went to the draining host")
			}
		}
		var draining []string
		for _, i := range perHost[drainer] {
			draining = append(draining, ids[i])
		}
		// Sessions the test created after the first hundred may be there too.
		draining = append(draining, c.sessionsOn(drainer)...)
		if st, r := c.exec(gwB, draining[0], "print(x)"); st != 200 || r.Status != "ok" {
			t.Errorf("a draining host's session: %d %+v", st, r)
		}
		select {
		case <-c.hosts[di].done:
			t.Fatal("the draining host exited with sessions open")
		default:
		}
		for _, id := range draining {
			c.call(gwA, "DELETE", "/v1/sessions/"+id, nil, nil)
		}
		c.hosts[di].wait(c)
	})

	c.phase("gateway restart", time.Minute, func(t *testing.T) {
		// A gateway killed and restarted loses nothing but its in-flight requests.
		for h, is := range perHost {
			if h != victim && h != drainer {
				live = ids[is[0]]
			}
		}
		c.gws[0].signal(syscall.SIGKILL)
		c.gws[0].wait(c)
		gwA = c.startGateway(0, gwA.addr)
		c.gws[0] = gwA
		c.waitFor("the restarted gateway routes", func() bool {
			st, r := c.exec(gwA, live, "print(x)")
			return st == 200 && r.Status == "ok"
		})
	})

	c.phase("postgres restart", 2*time.Minute, func(t *testing.T) {
		// PostgreSQL restarts: routes cached in B keep working meanwhile, and
		// both gateways reconnect (placement needs the table again).
		c.pg.Stop()
		if st, r := c.exec(gwB, live, "print(x)"); st != 200 || r.Status != "ok" {
			t.Errorf("a cached route while PostgreSQL is down: %d %+v", st, r)
		}
		if err := c.pg.Start(); err != nil {
			t.Fatal(err)
		}
		for _, gw := range c.gws {
			c.waitFor(gw.name+" reconnects to PostgreSQL", func() bool {
				var s struct {
					ID string `json:"id"`
				}
				if c.call(gw, "POST", "/v1/sessions", nil, &s) != http.StatusCreated {
					return false
				}
				var h struct {
					Notifications bool `json:"notifications"`
				}
				c.call(gw, "GET", "/healthz", nil, &h)
				return h.Notifications
			})
		}
	})
}

// checkFiles: a 3 MiB upload through A, downloaded through B, and an archive.
func (c *cell) checkFiles(t *testing.T, gwA, gwB *proc, id string) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
	if resp, err := http.DefaultClient.Do(c.request(gwA, "PUT", "/v1/sessions/"+id+"/files/data/big.bin", bytes.NewReader(big))); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("upload: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	resp, err := http.DefaultClient.Do(c.request(gwB, "GET", "/v1/sessions/"+id+"/files/data/big.bin", nil))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, big) {
		t.Errorf("download: %d bytes back of %d", len(got), len(big))
	}
	req, _ := http.NewRequestWithContext(c.ctx, "GET", "http://"+gwA.addr+"/v1/sessions/"+id+"/archive?format=zip&token="+c.token, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	zb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if zr, err := zip.NewReader(bytes.NewReader(zb), int64(len(zb))); err != nil || !zipHas(zr, "data/big.bin") {
		t.Errorf("archive: %v (%d bytes, status %d)", err, len(zb), resp.StatusCode)
	}
}

// checkStreams: streams are not buffered. The program waits for a file
// that is only uploaded (through the other gateway) once its first line
// arrived.
func (c *cell) checkStreams(t *testing.T, gwA, gwB *proc, id string) {
	for _, accept := range []string{"application/x-ndjson", "text/event-stream"} {
		code := "import os, time\nprint('ready', flush=True)\nwhile not os.path.exists('go-" + accept[:4] + "'): time.sleep(0.02)\nprint('done')"
		b, _ := json.Marshal(map[string]any{"code": code, "timeout_s": 30})
		req := c.request(gwA, "POST", "/v1/sessions/"+id+"/execute", bytes.NewReader(b))
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: the stream ended before its first line: %v", accept, err)
			}
			if strings.Contains(line, "ready") {
				break
			}
		}
		r2, err := http.DefaultClient.Do(c.request(gwB, "PUT", "/v1/sessions/"+id+"/files/go-"+accept[:4], strings.NewReader("go")))
		if err != nil || r2.StatusCode >= 300 {
			t.Fatalf("upload go: %v", err)
		}
		r2.Body.Close()
		rest, err := io.ReadAll(br)
		resp.Body.Close()
		if !strings.Contains(string(rest), "done") {
			t.Errorf("%s: rest of the stream (%v): %s", accept, err, rest)
		}
	}
}

// checkMCP: MCP through a gateway, a stateful session.
func (c *cell) checkMCP(t *testing.T, gw *proc) {
	hc := &http.Client{Transport: bearer{c.token}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cell-test", Version: "1"}, nil).
		Connect(c.ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + gw.addr + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("MCP via gateway: %v", err)
	}
	defer cs.Close()
	for _, code := range []string{"z = 6", "print(z * 7)"} {
		res, err := cs.CallTool(c.ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": code}})
		if err != nil {
			t.Fatal(err)
		}
		if code != "z = 6" && !strings.Contains(mcpText(res), "42") {
			t.Errorf("MCP state through the gateway: %s", mcpText(res))
		}
	}
}

// checkRun: a run started through A lists and streams through B.
func (c *cell) checkRun(t *testing.T, gwA, gwB *proc) {
	var run struct {
		ID string `json:"id"`
	}
	if st := c.call(gwA, "POST", "/v1/runs", map[string]any{"task": "write a greeting", "mode": "generate"}, &run); st != http.StatusCreated {
		t.Fatalf("start run: %d", st)
	}
	resp, err := http.DefaultClient.Do(c.request(gwB, "GET", "/v1/runs/"+run.ID+"/events", nil))
	if err != nil {
		t.Fatal(err)
	}
	events, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(events), "hi from the cell") || !strings.Contains(string(events), `"status":"done"`) || !strings.Contains(string(events), "event: end") {
		t.Errorf("run events via B: %d %v\n%s", resp.StatusCode, resp.Header, events)
	}
	var runs struct {
		Runs []struct {
			ID, Status string
		} `json:"runs"`
	}
	c.call(gwB, "GET", "/v1/runs", nil, &runs)
	if len(runs.Runs) != 1 || runs.Runs[0].ID != run.ID {
		t.Errorf("runs via B: %+v", runs)
	}
}

// sessionsOn lists the live sessions the table places on host.
func (c *cell) sessionsOn(host string) []string {
	conn, err := pgx.Connect(c.ctx, c.db)
	if err != nil {
		c.cur.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(c.ctx, `SELECT id FROM sessions WHERE host = $1 AND kind = 'session' AND NOT lost`, host)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.cur.Fatal(err)
	}
	return ids
}

// waitFor polls ok until it holds; at the phase's deadline the phase fails.
func (c *cell) waitFor(what string, ok func() bool) {
	c.cur.Helper()
	start := time.Now()
	for !ok() {
		select {
		case <-c.ctx.Done():
			c.cur.Fatalf("timed out waiting (%v): %s", time.Since(start).Round(time.Millisecond), what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func zipHas(zr *zip.Reader, name string) bool {
	for _, f := range zr.File {
		if f.Name == name {
			return true
		}
	}
	return false
}

func mcpText(res *mcp.CallToolResult) string {
	var sb strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			sb.WriteString(tc.Text)
		}
	}
	return sb.String()
}

// bearer adds the token to every request of the MCP client.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
