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

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// DefaultAnthropicBaseURL is Anthropic's API (without /v1, as the SDK wants it).
const DefaultAnthropicBaseURL = "https://api.anthropic.com"

// AnthropicOptions configures a Messages API provider.
type AnthropicOptions struct {
	// Model is e.g. "claude-sonnet-4-5". Required.
	Model string
	// APIKey is sent as x-api-key. It is never read from the environment here (see Resolve).
	APIKey string
	// BaseURL is the API root without /v1. If empty, DefaultAnthropicBaseURL.
	BaseURL string
	// MaxTokens caps replies when the Request does not; the API requires a cap.
	// If zero, 8192 (a size that also keeps non-streaming calls under the SDK's
	// ten-minute guard).
	MaxTokens int
	// Images says whether the model accepts images. If nil, SupportsImages guesses.
	Images *bool
	// Prices computes the cost. If nil, DefaultPrices.
	Prices Prices
	// Retry is the retry policy; the zero value is a sensible default.
	Retry RetryPolicy
	// HTTPClient makes the requests. If nil, as for OpenAIOptions.HTTPClient.
	HTTPClient *http.Client
	// Logger receives retries and oddities. If nil, logs are discarded.
	Logger *slog.Logger
}

// Anthropic is a Provider for the Anthropic Messages API.
type Anthropic struct {
	svc       anthropic.MessageService
	opts      AnthropicOptions
	base      string // the API root, without a trailing slash
	info      ModelInfo
	log       *slog.Logger
	prices    Prices
	configErr error
}

var _ Provider = (*Anthropic)(nil)

// NewAnthropic returns a provider for the Messages API. Invalid options surface as an
// error from the first Complete.
func NewAnthropic(o *AnthropicOptions) *Anthropic {
	opts := *cmp.Or(o, &AnthropicOptions{}) // nil: every default
	base := strings.TrimRight(opts.BaseURL, "/")
	if base == "" {
		base = DefaultAnthropicBaseURL
	}
	if opts.MaxTokens <= 0 {
		opts.MaxTokens = 8192
	}
	c := &Anthropic{opts: opts, base: base, log: discardIfNil(opts.Logger), prices: opts.Prices}
	if c.prices == nil {
		c.prices = DefaultPrices()
	}
	if opts.Model == "" {
		c.configErr = errors.New("llm: AnthropicOptions.Model is empty")
	}
	images := SupportsImages("anthropic", opts.Model)
	if opts.Images != nil {
		images = *opts.Images
	}
	c.info = ModelInfo{Provider: "anthropic", Model: opts.Model, Images: images}
	hc := opts.HTTPClient
	if hc == nil {
		hc = defaultHTTPClient()
	}
	// WithoutEnvironmentDefaults: the SDK would otherwise pick up ANTHROPIC_* variables,
	// profiles and federation on its own; Resolve reads the environment, explicitly.
	client := anthropic.NewClient(
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(base+"/"),
		option.WithAPIKey(opts.APIKey),
		option.WithHTTPClient(hc),
		option.WithMaxRetries(0), // retries are ours, see RetryPolicy
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			return guardJSON("anthropic", req, next)
		}),
	)
	c.svc = client.Messages
	return c
}

// Info implements Provider.
func (c *Anthropic) Info() ModelInfo { return c.info }

// PriceKnown reports whether the price table has the model, so that a cost
// budget can be enforced.
func (c *Anthropic) PriceKnown() bool {
	_, ok := c.prices.Lookup(c.info.Provider, c.opts.Model)
	return ok
}

// Complete implements Provider.
func (c *Anthropic) Complete(ctx context.Context, req Request) (*Response, error) {
	if c.configErr != nil {
		return nil, c.configErr
	}
	params, err := c.params(req)
	if err != nil {
		return nil, err
	}
	ro := requestOptions(req)
	return c.opts.Retry.run(ctx, c.log, c.info.String(), req, func(ctx context.Context) (*Response, bool, error) {
		if req.OnText != nil {
			return c.stream(ctx, params, req.OnText, ro)
		}
		msg, err := c.svc.New(ctx, params, ro...)
		if err != nil {
			return nil, false, c.wrap(err)
		}
		return c.fromMessage(msg), false, nil
	})
}

func (c *Anthropic) params(req Request) (anthropic.MessageNewParams, error) {
	maxTokens := req.MaxTokens
	if maxTokens <= 0 {
		maxTokens = c.opts.MaxTokens
	}
	p := anthropic.MessageNewParams{Model: anthropic.Model(c.opts.Model), MaxTokens: int64(maxTokens)}
	system, msgs, err := c.messages(req.Messages)
	if err != nil {
		return p, err
	}
	if system != "" {
		p.System = []anthropic.TextBlockParam{{Text: system}}
	}
	p.Messages = msgs
	for _, t := range req.Tools {
		schema, err := schemaObject(t)
		if err != nil {
			return p, err
		}
		in := anthropic.ToolInputSchemaParam{Properties: schema["properties"], ExtraFields: map[string]any{}}
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if s, ok := r.(string); ok {
					in.Required = append(in.Required, s)
				}
			}
		}
		for k, v := range schema {
			if k != "type" && k != "properties" && k != "required" {
				in.ExtraFields[k] = v
			}
		}
		tp := anthropic.ToolParam{Name: t.Name, InputSchema: in}
		if t.Description != "" {
			tp.Description = anthropic.String(t.Description)
		}
		p.Tools = append(p.Tools, anthropic.ToolUnionParam{OfTool: &tp})
	}
	return p, nil
}

// requestOptions carries what MessageNewParams has no field for in this SDK version.
func requestOptions(req Request) []option.RequestOption {
	if req.Temperature == nil {
		return nil
	}
	return []option.RequestOption{option.WithJSONSet("temperature", *req.Temperature)}
}

// messages converts the conversation. System messages become the system prompt; tool
// results join the user turn that follows the assistant's calls, as the API requires,
// and consecutive messages of one role are merged since roles must alternate.
func (c *Anthropic) messages(in []Message) (string, []anthropic.MessageParam, error) {
	var (
		system []string
		out    []anthropic.MessageParam
	)
	add := func(user bool, blocks []anthropic.ContentBlockParamUnion) {
		if len(blocks) == 0 {
			return
		}
		if n := len(out); n > 0 {
			last := &out[n-1]
			if user && last.OfUser != nil {
				last.OfUser.Content = append(last.OfUser.Content, blocks...)
				return
			}
			if !user && last.OfAssistant != nil {
				last.OfAssistant.Content = append(last.OfAssistant.Content, blocks...)
				return
			}
		}
		if user {
			out = append(out, anthropic.NewUserMessage(blocks...))
		} else {
			out = append(out, anthropic.NewAssistantMessage(blocks...))
		}
	}
	for i, m := range in {
		switch m.Role {
		case RoleSystem:
			system = append(system, m.Text)
		case RoleUser:
			text, images := keepImages(c.info, m.Text, m.Images)
			var blocks []anthropic.ContentBlockParamUnion
			// The API refuses empty text blocks.
			if text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(text))
			}
			for _, img := range images {
				blocks = append(blocks, anthropic.NewImageBlockBase64(mediaType(img), img.Data))
			}
			add(true, blocks)
		case RoleAssistant:
			var blocks []anthropic.ContentBlockParamUnion
			if m.Text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Text))
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, anthropic.NewToolUseBlock(tc.ID, toolInput(tc), tc.Name))
			}
			add(false, blocks)
		case RoleTool:
			if m.ToolCallID == "" {
				return "", nil, fmt.Errorf("llm: message %d: tool message without ToolCallID", i)
			}
			text, images := keepImages(c.info, m.Text, m.Images)
			tr := anthropic.ToolResultBlockParam{ToolUseID: m.ToolCallID}
			if m.IsError {
				tr.IsError = anthropic.Bool(true)
			}
			if text != "" {
				tr.Content = append(tr.Content, anthropic.ToolResultBlockParamContentUnion{OfText: &anthropic.TextBlockParam{Text: text}})
			}
			for _, img := range images {
				tr.Content = append(tr.Content, anthropic.ToolResultBlockParamContentUnion{OfImage: &anthropic.ImageBlockParam{
					Source: anthropic.ImageBlockParamSourceUnion{OfBase64: &anthropic.Base64ImageSourceParam{
						Data: img.Data, MediaType: anthropic.Base64ImageSourceMediaType(mediaType(img)),
					}},
				}})
			}
			add(true, []anthropic.ContentBlockParamUnion{{OfToolResult: &tr}})
		default:
			return "", nil, fmt.Errorf("llm: message %d: unknown role %q", i, m.Role)
		}
	}
	return strings.Join(system, "\n\n"), out, nil
}

// toolInput is the tool_use input sent back in the history. The API accepts only a
// JSON object there, so malformed arguments are replaced by {}; the agent's error
// result, which quotes them, is how the model learns what went wrong.
func toolInput(tc ToolCall) any {
	if tc.ValidArguments() {
		return json.RawMessage(strings.TrimSpace(tc.Arguments))
	}
	return map[string]any{}
}

func mediaType(img Image) string {
	if img.MediaType == "" {
		return "image/png"
	}
	return img.MediaType
}

func (c *Anthropic) stream(ctx context.Context, params anthropic.MessageNewParams, onText TextFunc, ro []option.RequestOption) (*Response, bool, error) {
	s := c.svc.NewStreaming(ctx, params, ro...)
	defer s.Close()
	type block struct {
		kind  string
		call  ToolCall
		input strings.Builder // partial_json pieces
		start string          // the input given in content_block_start
	}
	var (
		blocks  = map[int64]*block{}
		order   []int64
		text    strings.Builder
		usage   Usage
		stop    anthropic.StopReason
		model   string
		emitted bool
	)
	for s.Next() {
		ev := s.Current()
		switch ev.Type {
		case "message_start":
			model = string(ev.Message.Model)
			u := ev.Message.Usage
			usage = anthropicUsage(u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens, u.OutputTokens)
		case "content_block_start":
			b := &block{kind: ev.ContentBlock.Type}
			if b.kind == "tool_use" {
				b.call = ToolCall{ID: ev.ContentBlock.ID, Name: ev.ContentBlock.Name}
				b.start = ev.ContentBlock.JSON.Input.Raw()
			}
			if ev.ContentBlock.Type == "text" && ev.ContentBlock.Text != "" {
				text.WriteString(ev.ContentBlock.Text)
				onText(ev.ContentBlock.Text)
				emitted = true
			}
			if _, seen := blocks[ev.Index]; !seen {
				order = append(order, ev.Index)
			}
			blocks[ev.Index] = b
		case "content_block_delta":
			b := blocks[ev.Index]
			switch ev.Delta.Type {
			case "text_delta":
				if ev.Delta.Text != "" {
					text.WriteString(ev.Delta.Text)
					onText(ev.Delta.Text)
					emitted = true
				}
			case "input_json_delta":
				if b != nil {
					b.input.WriteString(ev.Delta.PartialJSON)
				}
			}
		case "message_delta":
			if ev.Delta.StopReason != "" {
				stop = ev.Delta.StopReason
			}
			// message_delta carries cumulative counts; input counts appear here only
			// on some API versions, so keep message_start's when absent.
			u := ev.Usage
			if u.OutputTokens > 0 {
				usage.OutputTokens = u.OutputTokens
			}
			if u.InputTokens+u.CacheReadInputTokens+u.CacheCreationInputTokens > 0 {
				out := usage.OutputTokens
				usage = anthropicUsage(u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens, out)
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, emitted, c.wrap(err)
	}
	msg := Message{Role: RoleAssistant, Text: text.String()}
	for _, i := range order {
		b := blocks[i]
		if b.kind != "tool_use" {
			continue
		}
		b.call.Arguments = b.input.String()
		if b.call.Arguments == "" {
			b.call.Arguments = b.start
		}
		if b.call.Arguments == "" || b.call.Arguments == "null" {
			b.call.Arguments = "{}"
		}
		msg.ToolCalls = append(msg.ToolCalls, b.call)
	}
	if model == "" {
		model = c.opts.Model
	}
	c.prices.price(c.info.Provider, c.opts.Model, &usage)
	return &Response{Message: msg, StopReason: anthropicStop(stop), Usage: usage, Model: model}, emitted, nil
}

func (c *Anthropic) fromMessage(m *anthropic.Message) *Response {
	msg := Message{Role: RoleAssistant}
	var text strings.Builder
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			args := string(b.Input)
			if args == "" || args == "null" {
				args = "{}"
			}
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
		}
	}
	msg.Text = text.String()
	u := m.Usage
	usage := anthropicUsage(u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens, u.OutputTokens)
	c.prices.price(c.info.Provider, c.opts.Model, &usage)
	model := string(m.Model)
	if model == "" {
		model = c.opts.Model
	}
	return &Response{Message: msg, StopReason: anthropicStop(m.StopReason), Usage: usage, Model: model}
}

// anthropicUsage normalizes counts: Anthropic's input_tokens excludes cached tokens,
// while Usage.InputTokens includes them (as OpenAI's prompt_tokens does).
func anthropicUsage(input, cacheRead, cacheWrite, output int64) Usage {
	return Usage{
		InputTokens:      input + cacheRead + cacheWrite,
		OutputTokens:     output,
		CacheReadTokens:  cacheRead,
		CacheWriteTokens: cacheWrite,
	}
}

func anthropicStop(s anthropic.StopReason) StopReason {
	switch s {
	case anthropic.StopReasonEndTurn, anthropic.StopReasonStopSequence, "":
		return StopEnd
	case anthropic.StopReasonToolUse:
		return StopToolUse
	case anthropic.StopReasonMaxTokens:
		return StopMaxTokens
	}
	return StopReason(s)
}

// inStreamStatus maps Anthropic's error types to the HTTP statuses they are documented with.
var inStreamStatus = map[string]int{
	"invalid_request_error": 400,
	"authentication_error":  401,
	"permission_error":      403,
	"not_found_error":       404,
	"request_too_large":     413,
	"rate_limit_error":      429,
	"api_error":             500,
	"timeout_error":         504,
	"overloaded_error":      529,
}

func (c *Anthropic) wrap(err error) error {
	var apiErr *anthropic.Error
	var je *InvalidJSONError
	if errors.As(err, &je) {
		return je
	}
	if !errors.As(err, &apiErr) {
		setting := "ANTHROPIC_BASE_URL"
		if c.base == DefaultAnthropicBaseURL {
			setting = ""
		}
		if ce := connectError("anthropic", setting, c.base, err); ce != nil {
			return ce
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("anthropic: stream cut short: %w", err)
		}
		return fmt.Errorf("anthropic: %w", err)
	}
	se := statusError{status: apiErr.StatusCode, message: errorMessage(apiErr.Message)}
	if apiErr.Response != nil {
		se.header = apiErr.Response.Header
	}
	if se.status < 400 {
		// An "event: error" inside a 200 stream: its type says what status it stands for.
		status := inStreamStatus[string(apiErr.Type())]
		if status == 401 || status == 403 || status == 404 {
			se.status = status
		} else {
			return &APIError{Provider: "anthropic", StatusCode: status, InStream: true, Message: se.message, Err: err}
		}
	}
	baseURL := ""
	if b := strings.TrimRight(c.opts.BaseURL, "/"); b != "" && b != DefaultAnthropicBaseURL {
		baseURL = b
	}
	return classify("anthropic", c.opts.Model, baseURL, "ANTHROPIC_API_KEY", se, err)
}
