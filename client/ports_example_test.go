package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"time"

	"github.com/sandloop/sandloop/client"
)

// A web app started in a session is reached through the server: a signed
// URL opens it in a browser (or any client) without the token.
func ExampleClient_Preview() {
	ctx := context.Background()
	c, err := client.New(serverURL, nil)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer c.DeleteSession(ctx, s.ID)

	app := `
import threading, http.server
class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"hello from " + self.path.encode())
threading.Thread(target=http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Hello).serve_forever, daemon=True).start()`
	if _, err := c.Execute(ctx, s.ID, app, nil); err != nil {
		log.Fatal(err)
	}
	ports, err := c.Ports(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("listening:", ports[0].Port)

	p, err := c.Preview(ctx, s.ID, 8000, 10*time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	// A browser opens p.URL (http://8000-ID.localhost:N/?sandloop_sig=...)
	// as it is. Go's resolver does not know *.localhost, so dial the
	// server and name the host.
	req, _ := http.NewRequest("GET", strings.Replace(p.URL, "/?", "/hi?", 1), nil)
	req.URL.Host = strings.TrimPrefix(serverURL, "http://")
	req.Host = strings.SplitN(strings.TrimPrefix(p.URL, "http://"), "/", 2)[0]
	// The first answer turns the grant into a cookie and redirects to the
	// same address without it, as a browser would follow.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(r *http.Request, via []*http.Request) error {
		r.URL.Host, r.Host = req.URL.Host, req.Host
		return nil
	}}
	resp, err := browser.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// listening: 8000
	// 200 hello from /hi
}
