package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/llm/llmtest"
)

// --json: every line carries the run's id, run_started first.
func TestAgentJSONCarriesRunID(t *testing.T) {
	useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"print(1)"}`)},
		{ToolCalls: tc("finish", `{"summary":"ok"}`)},
	})
	code, stdout, stderr := sandloop(t, "", "agent", "t", "--json", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d %s", code, stderr)
	}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	var id string
	n := 0
	for sc.Scan() {
		var e struct {
			Type  string `json:"type"`
			RunID string `json:"run_id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %d is not JSON: %q", n+1, sc.Text())
		}
		if n == 0 && (e.Type != "run_started" || len(e.RunID) < 8) {
			t.Fatalf("first line: %s", sc.Text())
		}
		if n == 0 {
			id = e.RunID
		}
		if e.RunID != id {
			t.Errorf("line %d has run_id %q, not %q: %s", n+1, e.RunID, id, sc.Text())
		}
		n++
	}
	if n < 5 || !strings.Contains(stderr, id) {
		t.Errorf("%d lines; stderr %q does not name run %s", n, stderr, id)
	}
}

// A model server sending broken JSON is told as such, with what it sent.
func TestAgentInvalidJSONFromModel(t *testing.T) {
	for _, tt := range []struct{ name, contentType, body, want string }{
		{"stream", "text/event-stream", "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hel\n\ndata: [DONE]\n\n", "chat.completion.chunk"},
		{"html", "application/json", "<html><body>Bad Gateway from the proxy</body></html>", "Bad Gateway from the proxy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.contentType)
				fmt.Fprint(w, tt.body)
			}))
			t.Cleanup(srv.Close)
			t.Setenv("SANDLOOP_MODEL", "openai/gpt-4o-mini")
			t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
			t.Setenv("OPENAI_API_KEY", "test-key")
			code, stdout, stderr := sandloop(t, "", "agent", "t", "--data-dir", t.TempDir())
			all := stdout + stderr
			if code == 0 || !strings.Contains(all, "the model server sent invalid JSON") || !strings.Contains(all, tt.want) {
				t.Errorf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
			}
		})
	}
}
