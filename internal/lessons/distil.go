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
		switch {
		case l.Item < 1 || l.Item > len(cands):
		case usable(t):
			texts[l.Item-1] = clip(t, 300)
		case t != "":
			texts[l.Item-1] = "" // unusable: the fallback writes this one
		}
	}
	if len(texts) == 0 && len(out.Lessons) > 0 {
		return nil, resp.Usage, fmt.Errorf("the model's lessons name no item")
	}
	return texts, resp.Usage, nil
}

// fallback writes a lesson without a model, readable on its own: the
// fact, or the error as Python said it and a compact before/after of the
// change that fixed it ("KeyError: 'date' (sales.csv): write `d['day']`
// instead of `d['date']`"), never the signature's placeholders nor code
// cut in the middle of a call.
func fallback(c Candidate) string {
	var b strings.Builder
	if c.Fact != "" {
		b.WriteString(c.Fact)
	} else {
		msg := c.Sig.Name
		if m := firstLine(c.Sig.Message); m != "" {
			msg += ": " + clip(m, 100)
		}
		b.WriteString(msg)
		if len(c.Files) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(fileNames(c.Files), ", "))
		}
	}
	before, after := beforeAfter(c.Fix)
	switch {
	case after != "" && before != "":
		fmt.Fprintf(&b, ": write `%s` instead of `%s`", after, before)
	case after != "":
		fmt.Fprintf(&b, ": write `%s`", after)
	case before != "":
		fmt.Fprintf(&b, ": do not write `%s`", before)
	case c.Fact == "":
		b.WriteString(": check this before running the code again")
	}
	if c.Fact == "" {
		b.WriteString(".")
	}
	return b.String()
}

// beforeAfter is the smallest readable change in a fix: of its first
// removed and added lines, the part that differs, widened to whole
// expressions (to the spaces, commas and brackets around it). A change
// too long to read in a line gives "".
func beforeAfter(fix string) (before, after string) {
	var removed, added string
	for _, l := range strings.Split(fix, "\n") {
		switch {
		case strings.HasPrefix(l, "-") && removed == "":
			removed = strings.TrimSpace(l[1:])
		case strings.HasPrefix(l, "+") && added == "":
			added = strings.TrimSpace(l[1:])
		}
	}
	if strings.HasSuffix(removed, "...") || strings.HasSuffix(added, "...") {
		return "", "" // a line fixDiff cut: not code any more
	}
	if removed != "" && added != "" {
		p := 0
		for p < len(removed) && p < len(added) && removed[p] == added[p] {
			p++
		}
		q := 0
		for q < len(removed)-p && q < len(added)-p && removed[len(removed)-1-q] == added[len(added)-1-q] {
			q++
		}
		for p > 0 && !strings.ContainsRune(delims, rune(removed[p-1])) {
			p--
		}
		for q > 0 && !strings.ContainsRune(delims, rune(removed[len(removed)-q])) {
			q--
		}
		// A bare literal ('day') says little: widen to the call it is in.
		if lit := removed[p:]; p > 0 && removed[p-1] == '(' && lit != "" && strings.ContainsRune("'\"0123456789", rune(lit[0])) {
			for p--; p > 0 && !strings.ContainsRune(delims, rune(removed[p-1])); p-- {
			}
			if q > 0 && removed[len(removed)-q] == ')' {
				q--
			}
		}
		removed, added = removed[p:len(removed)-q], added[p:len(added)-q]
	}
	removed, added = strings.TrimSpace(removed), strings.TrimSpace(added)
	if len(removed) > 80 || len(added) > 80 {
		return "", ""
	}
	return removed, added
}

// delims end an expression, for widening a change to whole ones.
const delims = " \t,;()"

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(s)
}

// usable says whether a lesson text the model wrote can go into prompts:
// not one that copied the signature's placeholders.
func usable(t string) bool {
	for _, p := range []string{"<q>", "<n>", "<path>", "<url>", "<addr>"} {
		if strings.Contains(t, p) {
			return false
		}
	}
	return t != ""
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
