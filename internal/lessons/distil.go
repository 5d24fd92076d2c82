package lessons

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/llm"
)

const distilPrompt = `You turn what a coding agent learned in one run into lessons for its future runs in the same sandbox.
For each numbered item (an error the agent hit and the change that fixed it, or a fact about the sandbox), write ONE lesson:
imperative, specific, at most 25 words, reusable for other tasks (name the library, function, file or column; say what to do instead).
Never copy data values, secrets or file contents; short identifiers are fine.
Answer with JSON only: {"lessons":[{"item":1,"text":"..."}]}. Leave out an item that teaches nothing reusable.`

// distilTimeout bounds the extra model call: the run is over, the user waits.
const distilTimeout = 60 * time.Second

// distil asks the model for one lesson text per candidate. It returns the
// texts by candidate index (missing for those it left out) and the call's
// usage; an error means the fallback must write them.
func distil(ctx context.Context, p llm.Provider, task string, cands []Candidate) (map[int]string, llm.Usage, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "The run's task: %s\n", clip(StripSecrets(task), 300))
	for i, c := range cands {
		fmt.Fprintf(&b, "\nItem %d (%s):\n", i+1, c.Scope)
		if c.Fact != "" {
			fmt.Fprintf(&b, "fact: %s\n", c.Fact)
		}
		fmt.Fprintf(&b, "error: %s\n", clip(StripSecrets(c.Sig.Name+": "+c.Sig.Message), 300))
		if len(c.Files) > 0 {
			fmt.Fprintf(&b, "files: %s\n", strings.Join(fileNames(c.Files), ", "))
		}
		if c.Fix != "" {
			fmt.Fprintf(&b, "fix:\n%s\n", StripSecrets(c.Fix))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, distilTimeout)
	defer cancel()
	resp, err := p.Complete(ctx, llm.Request{MaxTokens: 600, Messages: []llm.Message{
		{Role: llm.RoleSystem, Text: distilPrompt},
		{Role: llm.RoleUser, Text: b.String()},
	}})
	if err != nil {
		return nil, llm.Usage{}, err
	}
	text := strings.TrimSpace(resp.Message.Text)
	// Models like to fence JSON.
	if i, j := strings.IndexByte(text, '{'), strings.LastIndexByte(text, '}'); i >= 0 && j > i {
		text = text[i : j+1]
	}
	var out struct {
		Lessons []struct {
			Item int    `json:"item"`
			Text string `json:"text"`
		} `json:"lessons"`
	}
	if err := json.Unmarshal([]byte(text), &out); err != nil {
		return nil, resp.Usage, fmt.Errorf("the model's lessons are not the JSON asked for: %w", err)
	}
	texts := map[int]string{}
	for _, l := range out.Lessons {
		t := strings.TrimSpace(l.Text)
		if l.Item >= 1 && l.Item <= len(cands) && t != "" {
			texts[l.Item-1] = clip(t, 300)
		}
	}
	if len(texts) == 0 && len(out.Lessons) > 0 {
		return nil, resp.Usage, fmt.Errorf("the model's lessons name no item")
	}
	return texts, resp.Usage, nil
}

// fallback writes a lesson without a model: the error's signature and
// what fixed it, or the fact.
func fallback(c Candidate) string {
	var b strings.Builder
	if c.Fact != "" {
		b.WriteString(c.Fact)
	} else {
		fmt.Fprintf(&b, "To avoid %s", c.Sig.Text)
		if c.Sig.Detail != "" {
			fmt.Fprintf(&b, " (%s)", c.Sig.Detail)
		}
		if len(c.Files) > 0 {
			fmt.Fprintf(&b, " with %s", strings.Join(fileNames(c.Files), ", "))
		}
		b.WriteString(":")
	}
	if c.Fix != "" {
		var removed, added []string
		for _, l := range strings.Split(c.Fix, "\n") {
			switch {
			case strings.HasPrefix(l, "-") && len(removed) < 2:
				removed = append(removed, strings.TrimSpace(l[1:]))
			case strings.HasPrefix(l, "+") && len(added) < 2:
				added = append(added, strings.TrimSpace(l[1:]))
			}
		}
		if len(removed) > 0 {
			fmt.Fprintf(&b, " instead of `%s`", clip(strings.Join(removed, "; "), 100))
		}
		if len(added) > 0 {
			fmt.Fprintf(&b, " write `%s`", clip(strings.Join(added, "; "), 120))
		}
	}
	return b.String()
}

func fileNames(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i], _, _ = strings.Cut(k, "#")
	}
	return out
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.TrimSpace(s[:n-3]) + "..."
}
