package llm

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeOllama serves Ollama's model list, and counts probes.
func fakeOllama(t *testing.T, models ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/tags" {
			http.NotFound(w, r)
			return
		}
		var list []map[string]string
		for _, m := range models {
			list = append(list, map[string]string{"name": m, "model": m})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"models": list})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fakeModels serves an OpenAI-compatible /v1/models.
func fakeModels(t *testing.T, ids ...string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		var data []map[string]string
		for _, id := range ids {
			data = append(data, map[string]string{"id": id, "object": "model"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	}))
	t.Cleanup(srv.Close)
	return srv
}

// deadURL is a loopback address where nothing listens.
func deadURL(t *testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	u := srv.URL
	srv.Close()
	return u
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestResolve(t *testing.T) {
	ollama := fakeOllama(t, "llama3.2:latest", "qwen2.5-coder:7b")
	emptyOllama := fakeOllama(t)
	oneModel := fakeModels(t, "Qwen/Qwen2.5-Coder-7B")
	twoModels := fakeModels(t, "a", "b")
	dead := deadURL(t)

	cases := []struct {
		name    string
		cfg     Config
		env     map[string]string
		want    string // "provider/model" of the result
		wantErr []string
	}{
		{
			name: "nothing configured lists the ways", cfg: Config{OllamaURL: dead},
			wantErr: []string{"no language model configured", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ollama/", "SANDLOOP_MODEL", dead},
		},
		{
			name: "ollama without models is not used", cfg: Config{OllamaURL: emptyOllama.URL},
			wantErr: []string{"no language model configured", "ollama pull"},
		},
		{name: "local ollama found on its own, coder preferred", cfg: Config{OllamaURL: ollama.URL}, want: "ollama/qwen2.5-coder:7b"},
		{name: "OLLAMA_HOST", env: map[string]string{"OLLAMA_HOST": strings.TrimPrefix(ollama.URL, "http://")}, want: "ollama/qwen2.5-coder:7b"},
		{name: "anthropic key", cfg: Config{OllamaURL: ollama.URL}, env: map[string]string{"ANTHROPIC_API_KEY": "k"}, want: "anthropic/" + DefaultAnthropicModel},
		{name: "openai key", cfg: Config{OllamaURL: dead}, env: map[string]string{"OPENAI_API_KEY": "k"}, want: "openai/" + DefaultOpenAIModel},
		{name: "base url with one model", env: map[string]string{"OPENAI_BASE_URL": oneModel.URL + "/v1"}, want: "openai-compatible/Qwen/Qwen2.5-Coder-7B"},
		{name: "base url with two models", env: map[string]string{"OPENAI_BASE_URL": twoModels.URL + "/v1"}, wantErr: []string{"several models", "a, b", "SANDLOOP_MODEL"}},
		{name: "base url unreachable", env: map[string]string{"OPENAI_BASE_URL": dead + "/v1"}, wantErr: []string{"listing its models failed"}},
		{name: "SANDLOOP_MODEL openai", env: map[string]string{"SANDLOOP_MODEL": "openai/gpt-4.1", "OPENAI_API_KEY": "k"}, want: "openai/gpt-4.1"},
		{name: "flag beats env", cfg: Config{Model: "anthropic/claude-haiku-4-5", AnthropicAPIKey: "k"}, env: map[string]string{"SANDLOOP_MODEL": "openai/gpt-4.1"}, want: "anthropic/claude-haiku-4-5"},
		{name: "openai without key", env: map[string]string{"SANDLOOP_MODEL": "openai/gpt-4o"}, wantErr: []string{"OPENAI_API_KEY"}},
		{name: "anthropic without key", cfg: Config{Model: "anthropic/claude-sonnet-4-5"}, wantErr: []string{"ANTHROPIC_API_KEY"}},
		{name: "openrouter", cfg: Config{Model: "openrouter/anthropic/claude-sonnet-4.5"}, env: map[string]string{"OPENROUTER_API_KEY": "k"}, want: "openrouter/anthropic/claude-sonnet-4.5"},
		{name: "openrouter without key", cfg: Config{Model: "openrouter/x/y"}, wantErr: []string{"OPENROUTER_API_KEY"}},
		{name: "compatible", cfg: Config{Model: "openai-compatible/llama", OpenAIBaseURL: "http://127.0.0.1:1/v1"}, want: "openai-compatible/llama"},
		{name: "compatible without base url", cfg: Config{Model: "openai-compatible/llama"}, wantErr: []string{"OPENAI_BASE_URL"}},
		{name: "explicit ollama", cfg: Config{Model: "ollama/llama3.2", OllamaURL: ollama.URL}, want: "ollama/llama3.2"},
		{name: "explicit ollama, model not pulled", cfg: Config{Model: "ollama/mistral", OllamaURL: ollama.URL}, wantErr: []string{"ollama pull mistral", "qwen2.5-coder:7b"}},
		{name: "explicit ollama, not running", cfg: Config{Model: "ollama/mistral", OllamaURL: dead}, wantErr: []string{"no Ollama at", "ollama serve"}},
		{name: "bare claude name", cfg: Config{Model: "claude-opus-4-1", AnthropicAPIKey: "k"}, want: "anthropic/claude-opus-4-1"},
		{name: "bare o3 name", cfg: Config{Model: "o3", OpenAIAPIKey: "k"}, want: "openai/o3"},
		{name: "bare unknown name", cfg: Config{Model: "mystery"}, wantErr: []string{"PROVIDER/mystery"}},
		{name: "unknown provider", cfg: Config{Model: "acme/m1"}, wantErr: []string{`unknown model provider "acme"`}},
		{name: "empty model", cfg: Config{Model: "openai/"}, wantErr: []string{"names no model"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			cfg.Getenv = env(tc.env)
			p, err := Resolve(t.Context(), cfg)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("got %s, want an error", p.Info())
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Info().String(); got != tc.want {
				t.Errorf("resolved %s, want %s", got, tc.want)
			}
		})
	}
}

func TestResolveNoModelErrorType(t *testing.T) {
	_, err := Resolve(t.Context(), Config{OllamaURL: deadURL(t), Getenv: env(nil)})
	var nm *NoModelError
	if !errors.As(err, &nm) || nm.OllamaErr == nil {
		t.Fatalf("err = %v, want *NoModelError with the Ollama probe's failure", err)
	}
}

func TestResolveDrivesTheServer(t *testing.T) {
	// An ollama model resolved from the environment is reached on Ollama's /v1 API,
	// with no key and the configured price (zero) and image capability.
	var (
		mu  sync.Mutex
		got []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/tags":
			_, _ = w.Write([]byte(`{"models":[{"name":"llava:7b"}]}`))
		case "/v1/chat/completions":
			_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","model":"llava:7b","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`))
		}
	}))
	t.Cleanup(srv.Close)
	// OPENAI_API_KEY is set, but must not leak to Ollama.
	p, err := Resolve(t.Context(), Config{Model: "ollama/llava:7b", OllamaURL: srv.URL, Getenv: env(map[string]string{"OPENAI_API_KEY": "sk-secret"})})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.Complete(t.Context(), Request{Messages: userHello})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Message.Text != "hi" || resp.Usage.CostUnknown || resp.Usage.Cost != 0 || !p.Info().Images {
		t.Errorf("resp = %+v, info = %+v", resp, p.Info())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"GET /api/tags auth=", "POST /v1/chat/completions auth="}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("requests = %q, want %q", got, want)
	}
}

func TestResolvePricesFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "prices.json")
	if err := os.WriteFile(path, []byte(`{"openai/gpt-4o-mini": {"input": 1, "output": 2}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Resolve(t.Context(), Config{Model: "openai/gpt-4o-mini", Getenv: env(map[string]string{"OPENAI_API_KEY": "k", "SANDLOOP_PRICES": path})})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.(*OpenAI).prices["openai/gpt-4o-mini"]; got.Input != 1 || got.Output != 2 {
		t.Errorf("override not applied: %+v", got)
	}
	if _, ok := p.(*OpenAI).prices["claude-sonnet-4-5"]; !ok {
		t.Error("override replaced the defaults instead of merging")
	}
	if err := os.WriteFile(path, []byte(`{"x": {"input": -1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(t.Context(), Config{Model: "openai/gpt-4o-mini", PricesFile: path, Getenv: env(map[string]string{"OPENAI_API_KEY": "k"})}); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("bad price file: err = %v", err)
	}
}

func TestOllamaURL(t *testing.T) {
	cases := map[string]string{
		"":                      DefaultOllamaURL,
		"127.0.0.1:11434":       "http://127.0.0.1:11434",
		"0.0.0.0":               "http://127.0.0.1:11434",
		"http://gpu-box:8000":   "http://gpu-box:8000",
		"https://ollama.lan/":   "https://ollama.lan:11434",
		"[::]:11434":            "http://127.0.0.1:11434",
		"localhost":             "http://localhost:11434",
		"http://10.0.0.2:11434": "http://10.0.0.2:11434",
	}
	for in, want := range cases {
		if got := ollamaURL(in); got != want {
			t.Errorf("ollamaURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A server at OPENAI_BASE_URL is not OpenAI, whatever its model is called: it is not
// charged OpenAI's list price, only the prices the user gave.
func TestResolveNoListPriceAtAnotherServer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "prices.json")
	if err := os.WriteFile(path, []byte(`{"openai-compatible/local-coder": {"input": 0.5, "output": 1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	local := "http://127.0.0.1:8799/v1"
	for _, tc := range []struct {
		name  string
		model string
		env   map[string]string
		known bool
	}{
		{"OpenAI itself", "openai/gpt-4o", map[string]string{"OPENAI_API_KEY": "k"}, true},
		{"OpenAI's URL given", "openai/gpt-4o", map[string]string{"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "https://api.openai.com/v1/"}, true},
		{"local server, openai/", "openai/gpt-4o", map[string]string{"OPENAI_BASE_URL": local}, false},
		{"local server, compatible/", "openai-compatible/gpt-4o-mini", map[string]string{"OPENAI_BASE_URL": local}, false},
		{"local server, bare name", "gpt-4o", map[string]string{"OPENAI_BASE_URL": local}, false},
		{"local server, priced by the user", "openai-compatible/local-coder", map[string]string{"OPENAI_BASE_URL": local, "SANDLOOP_PRICES": path}, true},
	} {
		p, err := Resolve(t.Context(), Config{Model: tc.model, Getenv: env(tc.env)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := p.(*OpenAI).PriceKnown(); got != tc.known {
			t.Errorf("%s: PriceKnown() = %v, want %v", tc.name, got, tc.known)
		}
	}
	// Built directly, without a price table: the same rule.
	for base, known := range map[string]bool{local: false, "": true, DefaultOpenAIBaseURL: true, DefaultOpenRouterBaseURL: true} {
		if got := NewOpenAI(&OpenAIOptions{BaseURL: base, Model: "gpt-4o"}).PriceKnown(); got != known {
			t.Errorf("NewOpenAI at %q: PriceKnown() = %v, want %v", base, got, known)
		}
	}
}
