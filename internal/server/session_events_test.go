package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/session"
)

// GET /v1/sessions/{id}/events: the session's lifecycle as JSON, or
// replayed then live over SSE and NDJSON until its close; a closed
// session's events stay readable, and its other routes say why it is
// gone.
func TestSessionEventsOverHTTP(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{Tokens: []string{tokenA, tokenB}, Keepalive: 50 * time.Millisecond})
	sc := newSpecCheck(t, ts.URL, tokenA)
	other := newSpecCheck(t, ts.URL, tokenB)
	var s sessionJSON
	a := sc.do("POST", "/v1/sessions", `{}`)
	a.want(201, "")
	json.Unmarshal(a.body, &s)
	base := "/v1/sessions/" + s.ID
	type list struct {
		Events []session.Event `json:"events"`
		Ended  bool            `json:"ended"`
	}
	var l list
	a = sc.do("GET", base+"/events", "")
	a.want(200, "")
	json.Unmarshal(a.body, &l)
	if len(l.Events) != 1 || l.Events[0].Type != "created" || l.Events[0].Seq != 1 || l.Events[0].State != "running" || l.Ended {
		t.Fatalf("a new session's events: %s", a.body)
	}
	sc.do("GET", base+"/events?since=x", "").want(400, "bad_request")
	other.do("GET", base+"/events", "").want(404, "not_found")

	// A stream from after the first event: the next ones as they come,
	// then its end.
	req, _ := http.NewRequest("GET", ts.URL+base+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	sc.do("POST", base+"/pause", "").want(200, "")
	sc.do("POST", base+"/resume", "").want(200, "")
	sc.do("DELETE", base, "").want(204, "")
	var got []string
	timeout := time.After(30 * time.Second)
read:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				break read
			}
			switch {
			case strings.HasPrefix(line, "id: "), strings.HasPrefix(line, "event: "):
				got = append(got, line)
			case strings.HasPrefix(line, "data: {"):
				var e session.Event
				if err := json.Unmarshal([]byte(line[len("data: "):]), &e); err != nil {
					t.Errorf("data %q: %v", line, err)
				}
			}
		case <-timeout:
			t.Fatalf("the stream did not end after the close: %q", got)
		}
	}
	want := []string{"id: 2", "event: paused", "id: 3", "event: resumed", "id: 4", "event: closed", "event: end"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("stream: %q, want %q", got, want)
	}

	// Closed: its events stay (NDJSON replays them all and ends), and the
	// session's 404 says when and why it went.
	a = sc.do("GET", base+"/events", "", "Accept", "application/x-ndjson")
	a.want(200, "")
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(string(a.body)), "\n") {
		var e session.Event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("ndjson line %q: %v", line, err)
		}
		if e.Type != "keepalive" {
			types = append(types, e.Type)
		}
	}
	if strings.Join(types, ",") != "created,paused,resumed,closed" {
		t.Errorf("ndjson after the close: %s", a.body)
	}
	a = sc.do("GET", base+"/events?since=3", "")
	a.want(200, "")
	json.Unmarshal(a.body, &l)
	if len(l.Events) != 1 || l.Events[0].Type != "closed" || l.Events[0].Reason != "deleted by its owner" || !l.Ended {
		t.Errorf("since 3, closed: %s", a.body)
	}
	a = sc.do("GET", base, "")
	a.want(404, "not_found")
	if !strings.Contains(string(a.body), "was closed at") || !strings.Contains(string(a.body), "deleted by its owner") {
		t.Errorf("a closed session's 404: %s", a.body)
	}
	other.do("GET", base+"/events", "").want(404, "not_found")
}
