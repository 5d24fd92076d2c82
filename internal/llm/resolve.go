package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// Defaults used when the configuration names a provider but no model.
const (
	DefaultOpenAIModel    = "gpt-4o-mini"
	DefaultAnthropicModel = "claude-sonnet-4-5"
	DefaultOllamaURL      = "http://127.0.0.1:11434"
	// DefaultOpenRouterBaseURL is OpenRouter's OpenAI-compatible API.
	DefaultOpenRouterBaseURL = "https://openrouter.ai/api/v1"
)

// Config is how a model is chosen: flags first, then the environment. Every string
// field that is empty is read from the environment variable its comment names.
type Config struct {
	// Model is "provider/model" (--model): openai/gpt-4o-mini, anthropic/claude-sonnet-4-5,
	// ollama/qwen2.5-coder, openai-compatible/NAME (with OpenAIBaseURL), openrouter/VENDOR/NAME.
	// If empty, $SANDLOOP_MODEL; if that is empty too, Resolve picks the first usable of:
	// a compatible server at $OPENAI_BASE_URL, $ANTHROPIC_API_KEY, $OPENAI_API_KEY, a local Ollama.
	Model string

	OpenAIAPIKey     string // $OPENAI_API_KEY
	OpenAIBaseURL    string // $OPENAI_BASE_URL
	AnthropicAPIKey  string // $ANTHROPIC_API_KEY
	AnthropicBaseURL string // $ANTHROPIC_BASE_URL
	OpenRouterAPIKey string // $OPENROUTER_API_KEY
	// OllamaURL is where Ollama listens. If empty, $OLLAMA_HOST, then DefaultOllamaURL.
	OllamaURL string
	// PricesFile is a JSON price table (see ReadPrices) merged over Prices.
	// If empty, $SANDLOOP_PRICES; if that is empty, none.
	PricesFile string

	// Prices is the price table. If nil, DefaultPrices.
	Prices Prices
	// Images overrides whether the model accepts images. If nil, SupportsImages guesses.
	Images *bool
	// MaxTokens caps each reply. If zero, the provider's default.
	MaxTokens int
	// ProbeTimeout bounds each request to a local server made while resolving
	// (finding Ollama, listing a server's models). If zero, 500ms.
	ProbeTimeout time.Duration
	// Retry is the retry policy of the provider; the zero value is a sensible default.
	Retry RetryPolicy
	// HTTPClient is used for probes and calls. If nil, a default client.
	HTTPClient *http.Client
	// Logger receives what was chosen and why. If nil, logs are discarded.
	Logger *slog.Logger
	// Getenv reads the environment. If nil, os.Getenv. Tests set it.
	Getenv func(string) string
}

// NoModelError says that nothing is configured, and how to configure something.
type NoModelError struct {
	// OllamaURL is where a local Ollama was looked for.
	OllamaURL string
	// OllamaErr is why it was not used (unreachable, or no models pulled).
	OllamaErr error
}

func (e *NoModelError) Error() string {
	var b strings.Builder
	b.WriteString("no language model configured; choose one with --model PROVIDER/MODEL (or SANDLOOP_MODEL):\n")
	b.WriteString("  openai/gpt-4o-mini               needs OPENAI_API_KEY\n")
	b.WriteString("  anthropic/claude-sonnet-4-5      needs ANTHROPIC_API_KEY\n")
	b.WriteString("  openrouter/VENDOR/MODEL          needs OPENROUTER_API_KEY\n")
	fmt.Fprintf(&b, "  ollama/qwen2.5-coder             needs Ollama running at %s (OLLAMA_HOST)\n", e.OllamaURL)
	b.WriteString("  openai-compatible/MODEL          needs OPENAI_BASE_URL, e.g. http://127.0.0.1:8000/v1 (vLLM, llama.cpp, LM Studio)\n")
	b.WriteString("Setting ANTHROPIC_API_KEY, OPENAI_API_KEY or OPENAI_BASE_URL alone picks a default model.")
	if e.OllamaErr != nil {
		fmt.Fprintf(&b, "\n(no local Ollama used: %v)", e.OllamaErr)
	}
	return b.String()
}

// ConfigError is a configuration that cannot work, such as a model without its key.
type ConfigError struct{ Msg string }

func (e *ConfigError) Error() string { return e.Msg }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Msg: fmt.Sprintf(format, args...)}
}

// Resolve picks and builds the provider that the flags and environment describe.
// It may make short requests to local servers (Ollama, a compatible server's model list).
func Resolve(ctx context.Context, cfg Config) (Provider, error) {
	r, err := newResolver(cfg)
	if err != nil {
		return nil, err
	}
	model := cfg.Model
	if model == "" {
		model = r.env("SANDLOOP_MODEL")
	}
	if model != "" {
		return r.named(ctx, model)
	}
	return r.detect(ctx)
}

type resolver struct {
	cfg    Config
	getenv func(string) string
	log    *slog.Logger
	hc     *http.Client
	prices Prices
	own    Prices // the prices the user gave (Config.Prices, the price file); never nil
	ollama string
}

func newResolver(cfg Config) (*resolver, error) {
	r := &resolver{cfg: cfg, getenv: cfg.Getenv, log: discardIfNil(cfg.Logger), hc: cfg.HTTPClient}
	if r.getenv == nil {
		r.getenv = os.Getenv
	}
	if r.hc == nil {
		r.hc = &http.Client{}
	}
	if r.cfg.ProbeTimeout <= 0 {
		r.cfg.ProbeTimeout = 500 * time.Millisecond
	}
	r.prices, r.own = cfg.Prices, cfg.Prices
	if r.prices == nil {
		r.prices, r.own = DefaultPrices(), Prices{}
	}
	if f := r.or(cfg.PricesFile, "SANDLOOP_PRICES"); f != "" {
		over, err := ReadPricesFile(f)
		if err != nil {
			return nil, fmt.Errorf("price table: %w", err)
		}
		r.prices, r.own = r.prices.Merge(over), r.own.Merge(over)
	}
	r.ollama = ollamaURL(r.or(cfg.OllamaURL, "OLLAMA_HOST"))
	return r, nil
}

func (r *resolver) env(name string) string { return strings.TrimSpace(r.getenv(name)) }

// or returns the flag value if set, else the environment variable.
func (r *resolver) or(flag, envVar string) string {
	if flag != "" {
		return flag
	}
	return r.env(envVar)
}

// named builds the provider for an explicit "provider/model".
func (r *resolver) named(ctx context.Context, spec string) (Provider, error) {
	provider, model, ok := strings.Cut(spec, "/")
	if !ok {
		// A bare model name: guess the provider from well-known names.
		model = spec
		switch {
		case strings.HasPrefix(spec, "claude-"):
			provider = "anthropic"
		case strings.HasPrefix(spec, "gpt-"), isOpenAIReasoning(spec):
			provider = "openai"
		case r.or(r.cfg.OpenAIBaseURL, "OPENAI_BASE_URL") != "":
			provider = "openai-compatible"
		default:
			return nil, configErrorf("model %q has no provider; write it as PROVIDER/%s, e.g. ollama/%s or openai-compatible/%s", spec, spec, spec, spec)
		}
	}
	if model == "" {
		return nil, configErrorf("model %q names no model after the provider", spec)
	}
	switch provider {
	case "openai":
		key, base := r.or(r.cfg.OpenAIAPIKey, "OPENAI_API_KEY"), r.or(r.cfg.OpenAIBaseURL, "OPENAI_BASE_URL")
		if key == "" && base == "" {
			return nil, configErrorf("%s needs an API key: set OPENAI_API_KEY", spec)
		}
		return r.openAI(OpenAIOptions{Model: model, APIKey: key, BaseURL: base, Provider: "openai"}), nil
	case "openai-compatible", "compatible":
		base := r.or(r.cfg.OpenAIBaseURL, "OPENAI_BASE_URL")
		if base == "" {
			return nil, configErrorf("%s needs the server's address: set OPENAI_BASE_URL (e.g. http://127.0.0.1:8000/v1)", spec)
		}
		return r.openAI(OpenAIOptions{Model: model, BaseURL: base, APIKey: r.or(r.cfg.OpenAIAPIKey, "OPENAI_API_KEY"), Provider: "openai-compatible"}), nil
	case "openrouter":
		key := r.or(r.cfg.OpenRouterAPIKey, "OPENROUTER_API_KEY")
		if key == "" {
			return nil, configErrorf("%s needs an API key: set OPENROUTER_API_KEY", spec)
		}
		return r.openAI(OpenAIOptions{Model: model, BaseURL: DefaultOpenRouterBaseURL, APIKey: key, Provider: "openrouter", APIKeyEnv: "OPENROUTER_API_KEY"}), nil
	case "anthropic":
		key := r.or(r.cfg.AnthropicAPIKey, "ANTHROPIC_API_KEY")
		if key == "" {
			return nil, configErrorf("%s needs an API key: set ANTHROPIC_API_KEY", spec)
		}
		return r.anthropic(model, key), nil
	case "ollama":
		// Check now, so that "Ollama is not running" comes before the run starts and
		// not as a failed first step.
		models, err := r.ollamaModels(ctx)
		if err != nil {
			return nil, configErrorf("%s: no Ollama at %s (start it with `ollama serve`, or set OLLAMA_HOST): %v", spec, r.ollama, err)
		}
		if !slices.Contains(models, model) && !slices.Contains(models, model+":latest") {
			return nil, configErrorf("%s: Ollama at %s does not have model %q; pull it with `ollama pull %s` (it has: %s)", spec, r.ollama, model, model, listFew(models))
		}
		return r.openAI(OpenAIOptions{Model: model, BaseURL: r.ollama + "/v1", Provider: "ollama"}), nil
	}
	return nil, configErrorf("unknown model provider %q in %q; use openai, anthropic, ollama, openrouter or openai-compatible", provider, spec)
}

// detect finds a model when none is named.
func (r *resolver) detect(ctx context.Context) (Provider, error) {
	if base := r.or(r.cfg.OpenAIBaseURL, "OPENAI_BASE_URL"); base != "" {
		key := r.or(r.cfg.OpenAIAPIKey, "OPENAI_API_KEY")
		models, err := r.listModels(ctx, base, key)
		switch {
		case err != nil:
			return nil, configErrorf("OPENAI_BASE_URL is %s but no model is named, and listing its models failed (%v); set SANDLOOP_MODEL=openai-compatible/MODEL", base, err)
		case len(models) == 1:
			r.log.InfoContext(ctx, "using the only model of the server at OPENAI_BASE_URL", "base_url", base, "model", models[0])
			return r.openAI(OpenAIOptions{Model: models[0], BaseURL: base, APIKey: key}), nil
		case len(models) == 0:
			return nil, configErrorf("the server at OPENAI_BASE_URL (%s) lists no models; set SANDLOOP_MODEL=openai-compatible/MODEL", base)
		default:
			return nil, configErrorf("the server at OPENAI_BASE_URL (%s) has several models; choose one with SANDLOOP_MODEL=openai-compatible/MODEL: %s", base, listFew(models))
		}
	}
	if key := r.or(r.cfg.AnthropicAPIKey, "ANTHROPIC_API_KEY"); key != "" {
		r.log.InfoContext(ctx, "using Anthropic, as ANTHROPIC_API_KEY is set", "model", DefaultAnthropicModel)
		return r.anthropic(DefaultAnthropicModel, key), nil
	}
	if key := r.or(r.cfg.OpenAIAPIKey, "OPENAI_API_KEY"); key != "" {
		r.log.InfoContext(ctx, "using OpenAI, as OPENAI_API_KEY is set", "model", DefaultOpenAIModel)
		return r.openAI(OpenAIOptions{Model: DefaultOpenAIModel, APIKey: key}), nil
	}
	models, err := r.ollamaModels(ctx)
	if err == nil && len(models) == 0 {
		err = errors.New("Ollama is running but has no models; pull one, e.g. `ollama pull qwen2.5-coder`")
	}
	if err != nil {
		return nil, &NoModelError{OllamaURL: r.ollama, OllamaErr: err}
	}
	model := pickOllamaModel(models)
	r.log.InfoContext(ctx, "using a local Ollama", "url", r.ollama, "model", model)
	return r.openAI(OpenAIOptions{Model: model, BaseURL: r.ollama + "/v1", Provider: "ollama"}), nil
}

func (r *resolver) openAI(o OpenAIOptions) Provider {
	o.Images, o.MaxTokens, o.Prices = r.cfg.Images, r.cfg.MaxTokens, r.prices
	if o.BaseURL != "" && !officialOpenAI(o.BaseURL) && o.Provider != "ollama" && o.Provider != "openrouter" {
		// A server at OPENAI_BASE_URL that calls its model "gpt-4o" is not OpenAI and
		// does not charge OpenAI's list price: only the prices the user gave apply.
		o.Prices = r.own
	}
	o.Retry, o.HTTPClient, o.Logger = r.cfg.Retry, r.cfg.HTTPClient, r.cfg.Logger
	return NewOpenAI(&o)
}

func (r *resolver) anthropic(model, key string) Provider {
	return NewAnthropic(&AnthropicOptions{
		Model: model, APIKey: key, BaseURL: r.or(r.cfg.AnthropicBaseURL, "ANTHROPIC_BASE_URL"),
		Images: r.cfg.Images, MaxTokens: r.cfg.MaxTokens, Prices: r.prices,
		Retry: r.cfg.Retry, HTTPClient: r.cfg.HTTPClient, Logger: r.cfg.Logger,
	})

}

// ollamaModels asks Ollama's native API which models are pulled.
func (r *resolver) ollamaModels(ctx context.Context) ([]string, error) {
	var tags struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := r.getJSON(ctx, r.ollama+"/api/tags", "", &tags); err != nil {
		return nil, err
	}
	var names []string
	for _, m := range tags.Models {
		names = append(names, m.Name)
	}
	return names, nil
}

// listModels asks an OpenAI-compatible server for its models (GET /models).
func (r *resolver) listModels(ctx context.Context, base, key string) ([]string, error) {
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := r.getJSON(ctx, strings.TrimRight(base, "/")+"/models", key, &list); err != nil {
		return nil, err
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

func (r *resolver) getJSON(ctx context.Context, u, key string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	// A probe reads a small listing; the limit keeps a wrong server from feeding us forever.
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// pickOllamaModel prefers a coding model, as the agent writes code.
func pickOllamaModel(models []string) string {
	if i := slices.IndexFunc(models, func(m string) bool { return strings.Contains(m, "coder") }); i >= 0 {
		return models[i]
	}
	return models[0]
}

// ollamaURL normalizes OLLAMA_HOST's forms ("127.0.0.1:11434", "0.0.0.0", "http://h:p").
func ollamaURL(v string) string {
	if v == "" {
		return DefaultOllamaURL
	}
	if !strings.Contains(v, "://") {
		v = "http://" + v
	}
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return DefaultOllamaURL
	}
	host, port := u.Hostname(), u.Port()
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1" // the address Ollama binds to; clients reach it on loopback
	}
	if port == "" {
		port = "11434"
	}
	u.Host = net.JoinHostPort(host, port)
	return strings.TrimRight(u.String(), "/")
}

func isOpenAIReasoning(m string) bool {
	for _, p := range []string{"o1", "o3", "o4"} {
		if m == p || strings.HasPrefix(m, p+"-") {
			return true
		}
	}
	return false
}

func listFew(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	if len(s) > 10 {
		return strings.Join(s[:10], ", ") + fmt.Sprintf(" and %d more", len(s)-10)
	}
	return strings.Join(s, ", ")
}
