package llm

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/shared"
)

// DefaultOpenAIBaseURL is OpenAI's own API.
const DefaultOpenAIBaseURL = "https://api.openai.com/v1"

// OpenAIOptions configures a Chat Completions provider: OpenAI itself or any server
// speaking the same wire format (Ollama, vLLM, llama.cpp server, LM Studio, OpenRouter).
type OpenAIOptions struct {
	// Model is the model name the server knows, e.g. "gpt-4o-mini". Required.
	Model string
	// APIKey is sent as a bearer token. If empty, no Authorization header is sent,
	// which local servers accept. It is never read from the environment here (see Resolve).
	APIKey string
	// BaseURL is the API root including /v1. If empty, DefaultOpenAIBaseURL.
	BaseURL string
	// Provider names the service in errors, ModelInfo and price lookup.
	// If empty, "openai" for OpenAI's own URL and "openai-compatible" otherwise.
	Provider string
	// APIKeyEnv is the environment variable named when the key is rejected.
	// If empty, "OPENAI_API_KEY".
	APIKeyEnv string
	// Images says whether the model accepts images. If nil, SupportsImages guesses.
	Images *bool
	// MaxTokens caps replies when the Request does not. If zero, the server decides.
	MaxTokens int
	// Prices computes the cost. If nil, DefaultPrices at OpenAI, OpenRouter
	// and Ollama, and none elsewhere (a compatible server at BaseURL is not
	// charged OpenAI's list price for a model it calls gpt-4o).
	Prices Prices
	// Retry is the retry policy; the zero value is a sensible default.
	Retry RetryPolicy
	// HTTPClient makes the requests. If nil, a client with no overall timeout (streams
	// can be long; the context bounds them) that gives up on a server sending no
	// response headers for 10 minutes.
	HTTPClient *http.Client
	// Logger receives retries and oddities. If nil, logs are discarded.
	Logger *slog.Logger
}

// OpenAI is a Provider for the Chat Completions API.
type OpenAI struct {
	svc       openai.ChatCompletionService
	opts      OpenAIOptions
	official  bool   // OpenAI's own API, which wants max_completion_tokens
	base      string // the API root, without a trailing slash
	info      ModelInfo
	log       *slog.Logger
	prices    Prices
	configErr error
}

var _ Provider = (*OpenAI)(nil)

// NewOpenAI returns a provider for the Chat Completions API. Invalid options surface
// as an error from the first Complete, so that the constructor stays a one-liner.
func NewOpenAI(o *OpenAIOptions) *OpenAI {
	opts := *cmp.Or(o, &OpenAIOptions{}) // nil: every default
	base := strings.TrimRight(opts.BaseURL, "/")
	if base == "" {
		base = DefaultOpenAIBaseURL
	}
	official := officialOpenAI(base)
	if opts.Provider == "" {
		opts.Provider = "openai-compatible"
		if official {
			opts.Provider = "openai"
		}
	}
	if opts.APIKeyEnv == "" {
		opts.APIKeyEnv = "OPENAI_API_KEY"
	}
	c := &OpenAI{opts: opts, official: official, base: base, log: discardIfNil(opts.Logger), prices: opts.Prices}
	if c.prices == nil {
		c.prices = DefaultPrices()
		if !official && base != DefaultOpenRouterBaseURL && opts.Provider != "ollama" {
			// Another server's "gpt-4o" is not OpenAI's: no list price applies.
			c.prices = Prices{}
		}
	}
	if opts.Model == "" {
		c.configErr = errors.New("llm: OpenAIOptions.Model is empty")
	}
	images := SupportsImages(opts.Provider, opts.Model)
	if opts.Images != nil {
		images = *opts.Images
	}
	c.info = ModelInfo{Provider: opts.Provider, Model: opts.Model, Images: images}
	hc := opts.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient()
	}
	// NewChatCompletionService rather than NewClient: the client reads OPENAI_* from the
	// environment, which would send an OpenAI key (or org id) to whatever compatible
	// server the user pointed us at. Resolve reads the environment, explicitly.
	c.svc = openai.NewChatCompletionService(
		option.WithBaseURL(base+"/"),
		option.WithAPIKey(opts.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0), // retries are ours, see RetryPolicy
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			return guardJSON(opts.Provider, req, next)
		}),
	)
	return c
}

// officialOpenAI reports whether base is OpenAI's own API.
func officialOpenAI(base string) bool {
	return strings.HasPrefix(strings.TrimRight(base, "/")+"/", "https://api.openai.com/")
}

// Info implements Provider.
func (c *OpenAI) Info() ModelInfo { return c.info }

// PriceKnown reports whether the price table has the model, so that a cost
// budget can be enforced.
func (c *OpenAI) PriceKnown() bool {
	_, ok := c.prices.Lookup(c.info.Provider, c.opts.Model)
	return ok
}

// Complete implements Provider.
func (c *OpenAI) Complete(ctx context.Context, req Request) (*Response, error) {
	if c.configErr != nil {
		return nil, c.configErr
	}
	params, err := c.params(req)
	if err != nil {
		return nil, err
	}
	return c.opts.Retry.run(ctx, c.log, c.info.String(), req, func(ctx context.Context) (*Response, bool, error) {
		if req.OnText != nil {
			return c.stream(ctx, params, req.OnText)
		}
		resp, err := c.svc.New(ctx, params)
		if err != nil {
			return nil, false, c.wrap(err)
		}
		r, err := c.fromCompletion(resp)
		return r, false, err
	})
}

func (c *OpenAI) params(req Request) (openai.ChatCompletionNewParams, error) {
	p := openai.ChatCompletionNewParams{Model: shared.ChatModel(c.opts.Model)}
	msgs, err := c.messages(req.Messages)
	if err != nil {
		return p, err
	}
	p.Messages = msgs
	for _, t := range req.Tools {
		params, err := schemaObject(t)
		if err != nil {
			return p, err
		}
		fd := shared.FunctionDefinitionParam{Name: t.Name, Parameters: shared.FunctionParameters(params)}
		if t.Description != "" {
			fd.Description = openai.String(t.Description)
		}
		p.Tools = append(p.Tools, openai.ChatCompletionFunctionTool(fd))
	}
	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = c.opts.MaxTokens
	}
	if maxTokens > 0 {
		// OpenAI's reasoning models refuse max_tokens; many compatible servers only know it.
		if c.official {
			p.MaxCompletionTokens = openai.Int(int64(maxTokens))
		} else {
			p.MaxTokens = openai.Int(int64(maxTokens))
		}
	}
	if req.Temperature != nil {
		p.Temperature = openai.Float(*req.Temperature)
	}
	if req.OnText != nil {
		// Without this the stream carries no token counts, and cost is unknowable.
		p.StreamOptions.IncludeUsage = openai.Bool(true)
	}
	return p, nil
}

func (c *OpenAI) messages(in []Message) ([]openai.ChatCompletionMessageParamUnion, error) {
	var out []openai.ChatCompletionMessageParamUnion
	// Chat Completions takes text only in tool messages, and the tool messages must
	// follow their assistant message without a break. So images from a run of tool
	// results are held back and sent together in one user message right after it.
	var pending []openai.ChatCompletionContentPartUnionParam
	flush := func() {
		if len(pending) > 0 {
			out = append(out, openai.UserMessage(pending))
			pending = nil
		}
	}
	for i, m := range in {
		if m.Role != RoleTool {
			flush()
		}
		switch m.Role {
		case RoleSystem:
			out = append(out, openai.SystemMessage(m.Text))
		case RoleUser:
			text, images := c.keepImages(m.Text, m.Images)
			if len(images) == 0 {
				out = append(out, openai.UserMessage(text))
				continue
			}
			var parts []openai.ChatCompletionContentPartUnionParam
			if text != "" {
				parts = append(parts, openai.TextContentPart(text))
			}
			parts = append(parts, imageParts(images)...)
			out = append(out, openai.UserMessage(parts))
		case RoleAssistant:
			var a openai.ChatCompletionAssistantMessageParam
			if m.Text != "" || len(m.ToolCalls) == 0 {
				a.Content.OfString = openai.String(m.Text)
			}
			for _, tc := range m.ToolCalls {
				args := tc.Arguments
				if strings.TrimSpace(args) == "" {
					args = "{}"
				}
				// Malformed arguments go back verbatim: the model should see what it sent.
				a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       tc.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: tc.Name, Arguments: args},
					},
				})
			}
			out = append(out, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		case RoleTool:
			if m.ToolCallID == "" {
				return nil, fmt.Errorf("llm: message %d: tool message without ToolCallID", i)
			}
			text, images := c.keepImages(m.Text, m.Images)
			out = append(out, openai.ToolMessage(text, m.ToolCallID))
			if len(images) > 0 {
				pending = append(pending, openai.TextContentPart(fmt.Sprintf("Images from tool call %s:", m.ToolCallID)))
				pending = append(pending, imageParts(images)...)
			}
		default:
			return nil, fmt.Errorf("llm: message %d: unknown role %q", i, m.Role)
		}
	}
	flush()
	return out, nil
}

// keepImages drops images the model cannot take, saying so in the text so the model
// knows a plot existed.
func (c *OpenAI) keepImages(text string, images []Image) (string, []Image) {
	return keepImages(c.info, text, images)
}

func keepImages(info ModelInfo, text string, images []Image) (string, []Image) {
	if len(images) == 0 || info.Images {
		return text, images
	}
	note := fmt.Sprintf("[%d image(s) not shown: %s does not accept images]", len(images), info)
	if text == "" {
		return note, nil
	}
	return text + "\n" + note, nil
}

func imageParts(images []Image) []openai.ChatCompletionContentPartUnionParam {
	var parts []openai.ChatCompletionContentPartUnionParam
	for _, img := range images {
		mt := img.MediaType
		if mt == "" {
			mt = "image/png"
		}
		parts = append(parts, openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{
			URL: "data:" + mt + ";base64," + img.Data,
		}))
	}
	return parts
}

// schemaObject decodes a tool's schema; an empty one means no arguments.
func schemaObject(t Tool) (map[string]any, error) {
	if len(t.Parameters) == 0 {
		return map[string]any{"type": "object", "properties": map[string]any{}}, nil
	}
	var m map[string]any
	if err := json.Unmarshal(t.Parameters, &m); err != nil {
		return nil, fmt.Errorf("llm: tool %s: parameters are not a JSON object: %w", t.Name, err)
	}
	return m, nil
}

func (c *OpenAI) stream(ctx context.Context, params openai.ChatCompletionNewParams, onText TextFunc) (*Response, bool, error) {
	s := c.svc.NewStreaming(ctx, params)
	defer s.Close()
	var (
		text     strings.Builder
		calls    []ToolCall
		finish   string
		usage    openai.CompletionUsage
		hasUsage bool
		model    string
		emitted  bool
	)
	for s.Next() {
		chunk := s.Current()
		if chunk.Model != "" {
			model = chunk.Model
		}
		if chunk.JSON.Usage.Valid() && chunk.Usage.PromptTokens+chunk.Usage.CompletionTokens > 0 {
			usage, hasUsage = chunk.Usage, true
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // we never ask for n>1
			}
			if d := ch.Delta.Content; d != "" {
				text.WriteString(d)
				onText(d)
				emitted = true
			}
			for _, tc := range ch.Delta.ToolCalls {
				calls = mergeToolCallDelta(calls, tc)
			}
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, emitted, c.wrap(err)
	}
	if model == "" {
		model = c.opts.Model
	}
	r := &Response{
		Message:    Message{Role: RoleAssistant, Text: text.String(), ToolCalls: calls},
		StopReason: openAIStop(finish, len(calls) > 0),
		Model:      model,
	}
	if hasUsage {
		r.Usage = openAIUsage(usage)
	}
	c.prices.price(c.info.Provider, c.opts.Model, &r.Usage)
	if !hasUsage {
		c.log.Debug("stream carried no usage; the server may not support stream_options", "model", c.info.String())
	}
	return r, emitted, nil
}

// mergeToolCallDelta adds one streamed tool-call fragment. OpenAI sends the id and
// name first and then argument pieces under the same index; some compatible servers
// send each call whole, all under index 0, which a new id reveals.
func mergeToolCallDelta(calls []ToolCall, d openai.ChatCompletionChunkChoiceDeltaToolCall) []ToolCall {
	i := int(d.Index)
	if i < 0 || i > len(calls) || (i < len(calls) && d.ID != "" && calls[i].ID != "" && calls[i].ID != d.ID) {
		i = len(calls)
	}
	if i == len(calls) {
		calls = append(calls, ToolCall{})
	}
	if d.ID != "" {
		calls[i].ID = d.ID
	}
	if d.Function.Name != "" {
		calls[i].Name = d.Function.Name
	}
	calls[i].Arguments += d.Function.Arguments
	return calls
}

func (c *OpenAI) fromCompletion(resp *openai.ChatCompletion) (*Response, error) {
	if len(resp.Choices) == 0 {
		return nil, fmt.Errorf("%s: %w", c.info.Provider, errNoChoices)
	}
	ch := resp.Choices[0]
	msg := Message{Role: RoleAssistant, Text: ch.Message.Content}
	for _, tc := range ch.Message.ToolCalls {
		if tc.Type != "" && tc.Type != "function" {
			continue
		}
		msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
	}
	model := resp.Model
	if model == "" {
		model = c.opts.Model
	}
	r := &Response{
		Message:    msg,
		StopReason: openAIStop(ch.FinishReason, len(msg.ToolCalls) > 0),
		Usage:      openAIUsage(resp.Usage),
		Model:      model,
	}
	c.prices.price(c.info.Provider, c.opts.Model, &r.Usage)
	return r, nil
}

func openAIUsage(u openai.CompletionUsage) Usage {
	return Usage{
		InputTokens:     u.PromptTokens,
		OutputTokens:    u.CompletionTokens,
		CacheReadTokens: u.PromptTokensDetails.CachedTokens,
	}
}

func openAIStop(finish string, toolCalls bool) StopReason {
	switch finish {
	case "stop":
		// Some compatible servers say "stop" even when they return tool calls.
		if toolCalls {
			return StopToolUse
		}
		return StopEnd
	case "tool_calls", "function_call":
		return StopToolUse
	case "length":
		return StopMaxTokens
	case "":
		if toolCalls {
			return StopToolUse
		}
		return StopEnd
	}
	return StopReason(finish)
}

// wrap turns an SDK error into this package's errors.
func (c *OpenAI) wrap(err error) error {
	var apiErr *openai.Error
	var streamErr *ssestream.StreamError
	var je *InvalidJSONError
	if errors.As(err, &je) {
		return je
	}
	if errors.As(err, &streamErr) {
		// A "data: {"error": ...}" chunk inside a stream that had started fine.
		return &APIError{Provider: c.info.Provider, InStream: true, Message: errorMessage(streamErr.Message), Err: err}
	}
	if !errors.As(err, &apiErr) {
		if ce := connectError(c.info.Provider, c.baseSetting(), c.base, err); ce != nil {
			return ce
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%s: stream cut short: %w", c.info.Provider, err)
		}
		return fmt.Errorf("%s: %w", c.info.Provider, err)
	}
	se := statusError{status: apiErr.StatusCode, message: errorMessage(apiErr.Message)}
	if apiErr.Response != nil {
		se.header = apiErr.Response.Header
	}
	baseURL := ""
	if !c.official {
		baseURL = strings.TrimRight(c.opts.BaseURL, "/")
	}
	envVar := c.opts.APIKeyEnv
	if c.info.Provider == "ollama" {
		envVar = "" // Ollama has no keys; a 401 there comes from a proxy in front of it.
	}
	return classify(c.info.Provider, c.opts.Model, baseURL, envVar, se, err)
}

// baseSetting names the setting the base URL comes from, for error messages.
func (c *OpenAI) baseSetting() string {
	switch {
	case c.official, c.base == DefaultOpenRouterBaseURL:
		return ""
	case c.info.Provider == "ollama":
		return "OLLAMA_HOST"
	}
	return "OPENAI_BASE_URL"
}

func discardIfNil(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// defaultHTTPClient has no overall timeout, since a streamed reply may rightly take
// minutes, but bounds the wait for response headers, so a server that accepts the
// connection and never answers does not hold a run until its wall-clock limit. Ten
// minutes leaves room for a local server loading a large model on first use.
func defaultHTTPClient() *http.Client {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return &http.Client{}
	}
	t = t.Clone()
	t.ResponseHeaderTimeout = 10 * time.Minute
	return &http.Client{Transport: t}
}
