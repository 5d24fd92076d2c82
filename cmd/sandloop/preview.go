package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/portproxy"
)

// previewServer serves the previews of a foreground app run (sandloop
// agent --mode app) on the loopback while the command waits after the
// run: PORT-ID.localhost:N names a port of the run's sandbox, as on serve,
// and only a signed URL (its grant, then its cookie) passes, so another
// user of the machine cannot reach the app through it.
type previewServer struct {
	mu       sync.Mutex
	signer   *portproxy.Signer
	sessions map[string]portproxy.Dialer
	ln       net.Listener
	hs       *http.Server
	done     chan struct{}
}

func newPreviewServer() *previewServer {
	return &previewServer{signer: portproxy.NewSigner(), sessions: map[string]portproxy.Dialer{}}
}

// add makes session id's ports reachable (once its URL is handed out).
func (p *previewServer) add(id string, d portproxy.Dialer) {
	p.mu.Lock()
	p.sessions[id] = d
	p.mu.Unlock()
}

// url is runs.Options.PreviewURL: it starts listening at the first one.
func (p *previewServer) url(id string, port int, exp time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ""
		}
		p.ln, p.hs, p.done = ln, &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}, make(chan struct{})
		go func() { defer close(p.done); p.hs.Serve(ln) }()
	}
	t := portproxy.Target{ID: id, Port: port}
	_, lport, _ := net.SplitHostPort(p.ln.Addr().String())
	u := url.URL{Scheme: "http", Host: portproxy.HostName(t, "localhost:"+lport), Path: "/",
		RawQuery: url.Values{portproxy.SigParam: {p.signer.Sign(t, exp)}}.Encode()}
	return u.String()
}

func (p *previewServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, ok := portproxy.ParseHost(r.Host, nil)
	p.mu.Lock()
	d := p.sessions[t.ID]
	p.mu.Unlock()
	if !ok || d == nil {
		http.Error(w, "no preview here: open the URL sandloop printed (http://PORT-ID.localhost:"+strconv.Itoa(p.port())+"/?sandloop_sig=...)", http.StatusNotFound)
		return
	}
	granted, redirected := p.signer.Grant(w, r, t, "/")
	if redirected {
		return
	}
	if !granted {
		http.Error(w, "this preview needs the signed URL sandloop printed", http.StatusForbidden)
		return
	}
	portproxy.Serve(w, r, d, t.Port, &portproxy.Options{Path: r.URL.Path})
}

func (p *previewServer) port() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return 0
	}
	return p.ln.Addr().(*net.TCPAddr).Port
}

// close stops serving and waits for the server's goroutine.
func (p *previewServer) close() {
	p.mu.Lock()
	hs, done := p.hs, p.done
	p.mu.Unlock()
	if hs != nil {
		hs.Close()
		<-done
	}
}

// waitPreviews keeps the previews open until exp, ctx's end (Ctrl-C) or
// a line on in (Enter).
func waitPreviews(ctx context.Context, in io.Reader, exp time.Time) {
	line := make(chan struct{})
	go func() {
		// Ends with the process (or the test's pipe): a blocked read of
		// stdin cannot be cancelled.
		if _, err := bufio.NewReader(in).ReadString('\n'); err == nil {
			close(line)
		}
	}()
	t := time.NewTimer(time.Until(exp))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-line:
	}
}

// previewNote is what the CLI says while it keeps previews open.
func previewNote(exp time.Time) string {
	return fmt.Sprintf("sandloop: the app stays open at the preview URL above until %s: press Enter or Ctrl-C to close it", exp.Local().Format("15:04"))
}
