package llm

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Price is what a model costs, in US dollars per million tokens.
type Price struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cache_read,omitempty"`  // if zero, Input
	CacheWrite float64 `json:"cache_write,omitempty"` // if zero, Input
}

// Prices maps a model to its price. Keys are, from most to least specific:
// "provider/model", "model", or either ending in "*" as a prefix ("ollama/*").
// A dated snapshot ("gpt-4o-mini-2024-07-18") matches its base name's entry.
type Prices map[string]Price

// DefaultPrices are list prices as of late 2025. They go stale; override them with a
// JSON file (ReadPricesFile) rather than waiting for a release.
func DefaultPrices() Prices {
	return Prices{
		"gpt-4o":       {Input: 2.50, Output: 10, CacheRead: 1.25},
		"gpt-4o-mini":  {Input: 0.15, Output: 0.60, CacheRead: 0.075},
		"gpt-4.1":      {Input: 2, Output: 8, CacheRead: 0.50},
		"gpt-4.1-mini": {Input: 0.40, Output: 1.60, CacheRead: 0.10},
		"gpt-4.1-nano": {Input: 0.10, Output: 0.40, CacheRead: 0.025},
		"gpt-5":        {Input: 1.25, Output: 10, CacheRead: 0.125},
		"gpt-5-mini":   {Input: 0.25, Output: 2, CacheRead: 0.025},
		"gpt-5-nano":   {Input: 0.05, Output: 0.40, CacheRead: 0.005},
		"o3":           {Input: 2, Output: 8, CacheRead: 0.50},
		"o3-mini":      {Input: 1.10, Output: 4.40, CacheRead: 0.55},
		"o4-mini":      {Input: 1.10, Output: 4.40, CacheRead: 0.275},

		"claude-opus-4-5":   {Input: 5, Output: 25, CacheRead: 0.50, CacheWrite: 6.25},
		"claude-opus-4-1":   {Input: 15, Output: 75, CacheRead: 1.50, CacheWrite: 18.75},
		"claude-opus-4":     {Input: 15, Output: 75, CacheRead: 1.50, CacheWrite: 18.75},
		"claude-sonnet-4-5": {Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75},
		"claude-sonnet-4":   {Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75},
		"claude-3-7-sonnet": {Input: 3, Output: 15, CacheRead: 0.30, CacheWrite: 3.75},
		"claude-haiku-4-5":  {Input: 1, Output: 5, CacheRead: 0.10, CacheWrite: 1.25},
		"claude-3-5-haiku":  {Input: 0.80, Output: 4, CacheRead: 0.08, CacheWrite: 1},

		// A model on the user's own machine costs nothing per token.
		"ollama/*": {},
	}
}

// ReadPrices decodes a JSON object of the same shape as Prices:
//
//	{"openai/gpt-4o-mini": {"input": 0.15, "output": 0.6}, "my-model": {"input": 1, "output": 2}}
func ReadPrices(r io.Reader) (Prices, error) {
	var p Prices
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("decode prices: %w", err)
	}
	for k, v := range p {
		if v.Input < 0 || v.Output < 0 || v.CacheRead < 0 || v.CacheWrite < 0 {
			return nil, fmt.Errorf("decode prices: %q: negative price", k)
		}
	}
	return p, nil
}

// ReadPricesFile reads a price file (see ReadPrices).
func ReadPricesFile(path string) (Prices, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := ReadPrices(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Merge returns p with the entries of over added or replaced.
func (p Prices) Merge(over Prices) Prices {
	out := make(Prices, len(p)+len(over))
	for k, v := range p {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// Lookup finds the price of a model.
func (p Prices) Lookup(provider, model string) (Price, bool) {
	names := []string{provider + "/" + model, model}
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		// A router's "vendor/model" is priced like the vendor's model.
		names = append(names, model[i+1:])
	}
	for _, key := range names {
		if pr, ok := p[key]; ok {
			return pr, true
		}
	}
	// Dated snapshots and tags: the longest key that is a prefix ending at a separator,
	// so "gpt-4o-mini-2024-07-18" finds "gpt-4o-mini" and not "gpt-4o".
	for _, name := range names {
		best, bestLen := Price{}, -1
		for k, pr := range p {
			k = strings.TrimSuffix(k, "*")
			if len(k) > bestLen && strings.HasPrefix(name, k) && boundary(name, len(k)) {
				best, bestLen = pr, len(k)
			}
		}
		if bestLen >= 0 {
			return best, true
		}
	}
	return Price{}, false
}

// boundary reports whether name[:i] ends at a word boundary of a model name.
func boundary(name string, i int) bool {
	if i == 0 || i == len(name) {
		return i == len(name)
	}
	switch name[i-1] {
	case '/', '-', ':', '@', '.':
		return true
	}
	switch name[i] {
	case '-', ':', '@':
		return true
	}
	return false
}

// Cost prices u for the model. The second result is false if the model has no price.
func (p Prices) Cost(provider, model string, u Usage) (float64, bool) {
	pr, ok := p.Lookup(provider, model)
	if !ok {
		return 0, false
	}
	read, write := pr.CacheRead, pr.CacheWrite
	if read == 0 {
		read = pr.Input
	}
	if write == 0 {
		write = pr.Input
	}
	plain := max(u.InputTokens-u.CacheReadTokens-u.CacheWriteTokens, 0)
	c := float64(plain)*pr.Input + float64(u.CacheReadTokens)*read +
		float64(u.CacheWriteTokens)*write + float64(u.OutputTokens)*pr.Output
	return c / 1e6, true
}

// price fills in u's cost.
func (p Prices) price(provider, model string, u *Usage) {
	c, ok := p.Cost(provider, model, *u)
	u.Cost, u.CostUnknown = c, !ok
}
