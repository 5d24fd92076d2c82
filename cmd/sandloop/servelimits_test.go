package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/internal/server"
	"gopkg.in/yaml.v3"
)

// TestServeBodyLimitFlags: each body limit openapi.yaml names (x-max-bytes)
// is a serve flag whose help gives the same default, and setting it
// changes what the server takes.
func TestServeBodyLimitFlags(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(server.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	flags := newServeCmd().Flags()
	seen := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			o, _ := op.(map[string]any)
			body, _ := o["requestBody"].(map[string]any)
			lim, _ := body["x-max-bytes"].(map[string]any)
			flag, _ := lim["flag"].(string)
			def, _ := lim["default"].(int)
			if flag == "" {
				continue
			}
			seen[flag] = true
			f := flags.Lookup(strings.TrimPrefix(flag, "--"))
			if want := fmt.Sprintf("default %dM", def>>20); f == nil || !strings.Contains(f.Usage, want) {
				t.Errorf("%s %s: openapi.yaml names %s (%s); serve has %+v", method, path, flag, want, f)
			}
		}
	}
	if len(seen) != 3 {
		t.Errorf("openapi.yaml names the flags %v; want --max-body, --max-upload and --max-run-body", seen)
	}

	// No model: a run that gets past the limit is refused (400), never sent anywhere.
	for _, k := range []string{"SANDLOOP_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENROUTER_API_KEY", "OPENAI_BASE_URL"} {
		t.Setenv(k, "")
	}
	t.Setenv("OLLAMA_HOST", "127.0.0.1:9") // nothing listens on discard
	line, _ := serveOutput(t, "--max-body", "1k", "--max-run-body", "2k").ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "sandloop serving on ")
	if !ok {
		t.Fatalf("serve said %q", line)
	}
	post := func(path string, n int) int {
		body := `{"task":"` + strings.Repeat("x", n) + `"}`
		resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// 1.5 KiB: over --max-body, under --max-run-body (then refused for another reason).
	if got := post("/v1/sessions", 1500); got != 413 {
		t.Errorf("a 1.5 KiB session request under --max-body 1k: %d, want 413", got)
	}
	if got := post("/v1/runs", 1500); got != 400 {
		t.Errorf("a 1.5 KiB run request under --max-run-body 2k: %d, want 400 (no model)", got)
	}
	if got := post("/v1/runs", 2500); got != 413 {
		t.Errorf("a 2.5 KiB run request under --max-run-body 2k: %d, want 413", got)
	}
}
