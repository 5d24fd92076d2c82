package llm

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestPriceLookup(t *testing.T) {
	p := DefaultPrices().Merge(Prices{"openrouter/meta-llama/llama-3.3-70b": {Input: 0.1, Output: 0.3}})
	cases := []struct {
		provider, model string
		want            float64 // input price; -1 for not found
	}{
		{"openai", "gpt-4o-mini", 0.15},
		{"openai", "gpt-4o-mini-2024-07-18", 0.15}, // dated snapshot, not gpt-4o's price
		{"openai", "gpt-4o-2024-08-06", 2.50},
		{"openai", "o3-mini", 1.10},
		{"openai", "gpt-5.1", -1}, // a different model, not gpt-5
		{"anthropic", "claude-sonnet-4-5-20250929", 3},
		{"anthropic", "claude-sonnet-4-20250514", 3},
		{"anthropic", "claude-opus-4-1-20250805", 15},
		{"ollama", "qwen2.5-coder:7b", 0},
		{"openrouter", "openai/gpt-4o", 2.50},
		{"openrouter", "meta-llama/llama-3.3-70b", 0.1},
		{"openai-compatible", "mystery-model", -1},
	}
	for _, tc := range cases {
		pr, ok := p.Lookup(tc.provider, tc.model)
		if tc.want < 0 {
			if ok {
				t.Errorf("%s/%s: found %+v, want none", tc.provider, tc.model, pr)
			}
			continue
		}
		if !ok || pr.Input != tc.want {
			t.Errorf("%s/%s: %+v %v, want input %v", tc.provider, tc.model, pr, ok, tc.want)
		}
	}
}

func TestCost(t *testing.T) {
	p := Prices{"m": {Input: 2, Output: 10, CacheRead: 0.5, CacheWrite: 2.5}, "plain": {Input: 1, Output: 1}}
	u := Usage{InputTokens: 3_000_000, OutputTokens: 1_000_000, CacheReadTokens: 1_000_000, CacheWriteTokens: 1_000_000}
	if c, ok := p.Cost("x", "m", u); !ok || math.Abs(c-(2+0.5+2.5+10)) > 1e-9 {
		t.Errorf("cost = %v %v", c, ok)
	}
	// Cache prices default to the input price.
	if c, _ := p.Cost("x", "plain", u); math.Abs(c-4) > 1e-9 {
		t.Errorf("cost = %v, want 4", c)
	}
	total := Usage{}.Add(Usage{InputTokens: 1, Cost: 1}).Add(Usage{OutputTokens: 2, Cost: 2})
	if total.InputTokens != 1 || total.OutputTokens != 2 || total.Cost != 3 || total.CostUnknown {
		t.Errorf("sum = %+v", total)
	}
	if total.Add(Usage{CostUnknown: true}).CostUnknown != true {
		t.Error("an unknown cost must make the total unknown")
	}
}

func TestReadPrices(t *testing.T) {
	good := `{"openai/gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075}}`
	p, err := ReadPrices(strings.NewReader(good))
	if err != nil || p["openai/gpt-4o-mini"].CacheRead != 0.075 {
		t.Fatalf("p = %+v, err = %v", p, err)
	}
	for _, bad := range []string{`[]`, `{"m": {"inptu": 1}}`, `{"m": {"input": -1}}`, `{`} {
		if _, err := ReadPrices(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadPrices(%s): no error", bad)
		}
	}
}

func TestSupportsImages(t *testing.T) {
	cases := []struct {
		provider, model string
		want            bool
	}{
		{"openai", "gpt-4o-mini", true},
		{"openai", "gpt-4.1-nano", true},
		{"openai", "o3-mini", false},
		{"openai", "o1-mini", false},
		{"openai", "gpt-3.5-turbo", false},
		{"anthropic", "claude-haiku-4-5", true},
		{"ollama", "llava:13b", true},
		{"ollama", "qwen2.5vl:7b", true},
		{"ollama", "qwen2.5-coder:7b", false},
		{"openrouter", "openai/gpt-4o", true},
		{"openrouter", "anthropic/claude-sonnet-4.5", true},
		{"openai-compatible", "Qwen/Qwen2-VL-7B-Instruct", true},
		{"openai-compatible", "mistral-7b-instruct", false},
	}
	for _, tc := range cases {
		if got := SupportsImages(tc.provider, tc.model); got != tc.want {
			t.Errorf("SupportsImages(%s, %s) = %v, want %v", tc.provider, tc.model, got, tc.want)
		}
	}
}

func TestRetryAfterHeader(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		header, value string
		want          time.Duration
		ok            bool
	}{
		{"Retry-After", "0", 0, true},
		{"Retry-After", "7", 7 * time.Second, true},
		{"Retry-After", "1.5", 1500 * time.Millisecond, true},
		{"Retry-After", now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second, true},
		{"Retry-After", now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"Retry-After", "soon", 0, false},
		{"Retry-After", "-3", 0, false},
		{"Retry-After-Ms", "250", 250 * time.Millisecond, true},
		{"X-Other", "5", 0, false},
	}
	for _, tc := range cases {
		h := http.Header{}
		h.Set(tc.header, tc.value)
		got, ok := retryAfter(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %s = %v %v, want %v %v", tc.header, tc.value, got, ok, tc.want, tc.ok)
		}
	}
}

func TestToolCallValidArguments(t *testing.T) {
	for args, want := range map[string]bool{`{}`: true, ` {"a":1} `: true, `{"a":`: false, `[1]`: false, `"x"`: false, ``: false} {
		if got := (ToolCall{Arguments: args}).ValidArguments(); got != want {
			t.Errorf("ValidArguments(%q) = %v, want %v", args, got, want)
		}
	}
}
