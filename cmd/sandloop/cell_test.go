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
	log  *bytes.Buffer
	done chan struct{}
	err  error
}

type cell struct {
	t       *testing.T
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
	c.t.Helper()
	p := &proc{name: name, addr: addr, args: args, log: &bytes.Buffer{}, done: make(chan struct{})}
	// This test binary runs as the CLI with SANDLOOP_CLI_CHILD (TestMain).
	p.cmd = exec.Command(os.Args[0])
	p.cmd.Env = append(os.Environ(), append(c.env, "SANDLOOP_CLI_CHILD="+strings.Join(append(args, "--addr", addr), "\x1f"))...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case <-p.done:
			c.t.Fatalf("%s exited: %v\n%s", name, p.err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s did not come up\n%s", name, p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cell) startHost(i int, addr string) *proc {
	return c.start(fmt.Sprintf("host%d", i), addr, "serve", "--gateway-secret-file", c.secret, "--database", c.db,
		"--max-sessions", "70", "--pool", "1", "--drain-timeout", "60s", "--data-dir", c.t.TempDir())
}

func (c *cell) startGateway(i int, addr string) *proc {
	return c.start(fmt.Sprintf("gateway%d", i), addr, "gateway", "--gateway-secret-file", c.secret, "--database", c.db,
		"--hosts", c.hostCSV, "--token", c.token, "--health-interval", "200ms", "--lost-after", "2s", "--drain-timeout", "20s")
}

func (p *proc) signal(sig syscall.Signal) { p.cmd.Process.Signal(sig) }

func (p *proc) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s did not exit\n%s", p.name, p.log)
	}
}

// call sends a JSON request through a gateway and decodes the answer.
func (c *cell) call(gw *proc, method, path string, body any, out any) int {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+gw.addr+path, rd)
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s via %s: %v", method, path, gw.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
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

func (c *cell) create(gw *proc) string {
	c.t.Helper()
	var s struct {
		ID string `json:"id"`
	}
	if st := c.call(gw, "POST", "/v1/sessions", nil, &s); st != http.StatusCreated {
		c.t.Fatalf("create via %s: %d", gw.name, st)
	}
	return s.ID
}

// hostOf reads the sessions table: which host holds id.
func (c *cell) hostOf(id string) string {
	c.t.Helper()
	conn, err := pgx.Connect(context.Background(), c.db)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var h string
	if err := conn.QueryRow(context.Background(), `SELECT host FROM sessions WHERE id = $1`, id).Scan(&h); err != nil {
		c.t.Fatalf("session %s: %v", id, err)
	}
	return h
}

// newCell returns a cell whose processes are killed in t's cleanup (their
// logs shown if t failed).
func newCell(t *testing.T) *cell {
	c := &cell{t: t, token: "cell-test-token-0123456789"}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, p := range c.procs {
			p.cmd.Process.Kill() // by PID: only what this test started
			<-p.done
			if t.Failed() {
				t.Logf("--- %s log:\n%s", p.name, p.log)
			}
		}
	})
	return c
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

	var addrs []string
	for i := range 3 {
		addrs = append(addrs, freeAddr(t))
		c.hosts = append(c.hosts, c.startHost(i, addrs[i]))
	}
	c.hostCSV = "http://" + strings.Join(addrs, ",http://")
	c.gws = []*proc{c.startGateway(0, freeAddr(t)), c.startGateway(1, freeAddr(t))}
	gwA, gwB := c.gws[0], c.gws[1]
	waitFor(t, "gateways see 3 ready hosts", func() bool {
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

	// 100 sessions through both gateways, spread over all hosts.
	const n = 100
	ids := make([]string, n)
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
	perHost := map[string][]int{}
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
	if t.Failed() {
		t.FailNow()
	}

	// Sessions are per token, as on serve.
	var list struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	if st := c.call(gwB, "GET", "/v1/sessions", nil, &list); st != 200 || len(list.Sessions) < n {
		t.Errorf("list via B: %d, %d sessions", st, len(list.Sessions))
	}

	// Files: a 3 MiB upload through A, downloaded through B, and an archive.
	s0 := ids[0]
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16)
	req, _ := http.NewRequest("PUT", "http://"+gwA.addr+"/v1/sessions/"+s0+"/files/data/big.bin", bytes.NewReader(big))
	req.Header.Set("Authorization", "Bearer "+c.token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode >= 300 {
		t.Fatalf("upload: %v %v", resp.StatusCode, err)
	}
	req, _ = http.NewRequest("GET", "http://"+gwB.addr+"/v1/sessions/"+s0+"/files/data/big.bin", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(got, big) {
		t.Errorf("download: %d bytes back of %d", len(got), len(big))
	}
	req, _ = http.NewRequest("GET", "http://"+gwA.addr+"/v1/sessions/"+s0+"/archive?format=zip&token="+c.token, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	zb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if zr, err := zip.NewReader(bytes.NewReader(zb), int64(len(zb))); err != nil || !zipHas(zr, "data/big.bin") {
		t.Errorf("archive: %v (%d bytes, status %d)", err, len(zb), resp.StatusCode)
	}

	// Streams are not buffered: the program waits for a file that is only
	// uploaded (through the other gateway) once its first line arrived.
	for _, accept := range []string{"application/x-ndjson", "text/event-stream"} {
		s := ids[1]
		code := "import os, time\nprint('ready', flush=True)\nwhile not os.path.exists('go-" + accept[:4] + "'): time.sleep(0.02)\nprint('done')"
		b, _ := json.Marshal(map[string]any{"code": code, "timeout_s": 30})
		req, _ := http.NewRequest("POST", "http://"+gwA.addr+"/v1/sessions/"+s+"/execute", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+c.token)
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
		req, _ = http.NewRequest("PUT", "http://"+gwB.addr+"/v1/sessions/"+s+"/files/go-"+accept[:4], strings.NewReader("go"))
		req.Header.Set("Authorization", "Bearer "+c.token)
		if r2, err := http.DefaultClient.Do(req); err != nil || r2.StatusCode >= 300 {
			t.Fatalf("upload go: %v", err)
		}
		rest, rerr := io.ReadAll(br)
		resp.Body.Close()
		if !strings.Contains(string(rest), "done") {
			t.Errorf("%s: rest of the stream (%v, at %s): %s", accept, rerr, time.Now().Format("15:04:05.000"), rest)
		}
	}

	// MCP through gateway B: a stateful session.
	func() {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		hc := &http.Client{Transport: bearer{c.token}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "cell-test", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + gwB.addr + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatalf("MCP via gateway: %v", err)
		}
		defer cs.Close()
		for _, code := range []string{"z = 6", "print(z * 7)"} {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": code}})
			if err != nil {
				t.Fatal(err)
			}
			if code != "z = 6" && !strings.Contains(mcpText(res), "42") {
				t.Errorf("MCP state through the gateway: %s", mcpText(res))
			}
		}
	}()

	// A run started through A lists and streams through B.
	var run struct {
		ID string `json:"id"`
	}
	if st := c.call(gwA, "POST", "/v1/runs", map[string]any{"task": "write a greeting", "mode": "generate"}, &run); st != http.StatusCreated {
		t.Fatalf("start run: %d", st)
	}
	req, _ = http.NewRequest("GET", "http://"+gwB.addr+"/v1/runs/"+run.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err = http.DefaultClient.Do(req)
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

	// kill -9 of a host mid-stream: its sessions answer 410 within
	// seconds; the others keep their state; new sessions go elsewhere.
	victim := c.hostOf(ids[2])
	vi := indexOf(addrs, victim)
	streamErr := make(chan error, 1)
	go func() {
		b, _ := json.Marshal(map[string]any{"code": "import time\nprint('streaming', flush=True)\ntime.sleep(60)"})
		req, _ := http.NewRequest("POST", "http://"+gwA.addr+"/v1/sessions/"+ids[2]+"/execute", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+c.token)
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
	var lost []string
	for _, i := range perHost[victim] {
		lost = append(lost, ids[i])
	}
	waitFor(t, "410 for the killed host's sessions", func() bool {
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

	// The host restarts on its address: a new epoch, old sessions stay
	// gone, new ones land on it again.
	c.hosts[vi] = c.startHost(vi, victim)
	waitFor(t, "the restarted host rejoins", func() bool {
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

	// SIGTERM drains a host: no new sessions there, its open ones keep
	// working, and it exits once they are gone.
	var drainer string
	for h := range perHost {
		if h != victim {
			drainer = h
			break
		}
	}
	di := indexOf(addrs, drainer)
	c.hosts[di].signal(syscall.SIGTERM)
	waitFor(t, "the gateways see the host draining", func() bool {
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
	c.hosts[di].wait(t, 30*time.Second)

	// A gateway killed and restarted loses nothing but its in-flight requests.
	var live string
	for h, is := range perHost {
		if h != victim && h != drainer {
			live = ids[is[0]]
		}
	}
	c.gws[0].signal(syscall.SIGKILL)
	c.gws[0].wait(t, 10*time.Second)
	gwA = c.startGateway(0, gwA.addr)
	c.gws[0] = gwA
	waitFor(t, "the restarted gateway routes", func() bool {
		st, r := c.exec(gwA, live, "print(x)")
		return st == 200 && r.Status == "ok"
	})

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
		waitFor(t, gw.name+" reconnects to PostgreSQL", func() bool {
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
}

// sessionsOn lists the live sessions the table places on host.
func (c *cell) sessionsOn(host string) []string {
	conn, err := pgx.Connect(context.Background(), c.db)
	if err != nil {
		c.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, _ := conn.Query(context.Background(), `SELECT id FROM sessions WHERE host = $1 AND kind = 'session' AND NOT lost`, host)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	return ids
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(100 * time.Millisecond)
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
