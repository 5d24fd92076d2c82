package lessons

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"github.com/sandloop/sandloop/internal/agent"
)

// Candidate is something a run learned, before it is distilled into a
// lesson: a failure and the change that fixed it, or a sandbox fact.
type Candidate struct {
	Sig   Sig
	Scope string // global, files or task
	// Fix is the diff from the failing code to the code that then
	// succeeded ("" for a fact nothing fixed).
	Fix      string
	Files    []string // input files involved, "name#hash"
	Packages []string
	Step     int
	// Fact is a deterministic statement about the sandbox ("the module
	// seaborn is not installed"), for facts.
	Fact string
}

// pending is a failure waiting for the success that shows its fix.
type pending struct {
	sig   Sig
	tool  string
	code  string
	step  int
	files map[string]string // the workspace's text files (run_shell only)
}

var reNoNetwork = regexp.MustCompile(`(?i)name resolution|name or service not known|network is unreachable|nodename nor servname|no route to host|Failed to establish a new connection|getaddrinfo failed`)

// fact is what a failure alone says about the sandbox, or "".
func fact(s Sig) string {
	switch {
	case s.Name == "ModuleNotFoundError" && s.Detail != "":
		mod := strings.Fields(s.Detail)[0]
		return fmt.Sprintf("The module %s is not installed in this sandbox (and there is no network to install it): do without it.", mod)
	case reNoNetwork.MatchString(s.Message):
		return "The sandbox has no network: do not download anything; use the files in /workspace."
	}
	return ""
}

// scopeOf says where a lesson applies: sandbox facts everywhere, lessons
// naming an input file with that file, the rest with similar tasks.
func scopeOf(s Sig, code string, inputs map[string]string) (string, []string) {
	switch s.Name {
	case "ModuleNotFoundError", "ImportError":
		return "global", nil
	}
	if fact(s) != "" {
		return "global", nil
	}
	var files []string
	for name, key := range inputs {
		base := name[strings.LastIndexByte(name, '/')+1:]
		if strings.Contains(code, base) || strings.Contains(s.Message, base) {
			files = append(files, key)
		}
	}
	sort.Strings(files)
	if len(files) > 0 {
		return "files", files
	}
	// Errors about a library's API (a method that is gone, an argument
	// renamed) hold wherever that library is: this sandbox's versions.
	if s.Name == "AttributeError" && strings.Contains(s.Text, "has no attribute") || s.Name == "TypeError" && strings.Contains(s.Text, "unexpected keyword argument") {
		return "global", nil
	}
	return "task", nil
}

// similar says whether the code that succeeded is a version of the code
// that failed (a fix), not an unrelated look at the data.
func similar(a, b string) bool {
	ta, tb := tokens(a), tokens(b)
	if len(ta) == 0 || len(tb) == 0 {
		return false
	}
	common := 0
	for t := range ta {
		if tb[t] {
			common++
		}
	}
	return float64(common)/float64(len(ta)+len(tb)-common) >= 0.3
}

var reToken = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*|\d+|\S`)

func tokens(s string) map[string]bool {
	out := map[string]bool{}
	for _, t := range reToken.FindAllString(s, -1) {
		out[t] = true
	}
	return out
}

// fixDiff is a short unified diff from a to b: at most maxLines changed
// lines of at most 120 bytes, so a lesson never carries a file's contents.
func fixDiff(a, b string, maxLines int) string {
	d, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: difflib.SplitLines(a), B: difflib.SplitLines(b), Context: 0})
	var out []string
	for _, l := range strings.Split(d, "\n") {
		if strings.HasPrefix(l, "---") || strings.HasPrefix(l, "+++") || strings.HasPrefix(l, "@@") || len(strings.TrimSpace(l)) < 2 {
			continue
		}
		if len(l) > 120 {
			l = l[:117] + "..."
		}
		out = append(out, l)
		if len(out) == maxLines {
			out = append(out, "...")
			break
		}
	}
	return strings.Join(out, "\n")
}

// filesDiff diffs the text files that changed between two snapshots.
func filesDiff(before, after map[string]string, maxLines int) string {
	var paths []string
	for p, s := range after {
		if before[p] != s {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	var parts []string
	for _, p := range paths {
		if d := fixDiff(before[p], after[p], maxLines); d != "" {
			parts = append(parts, p+":\n"+d)
		}
	}
	return strings.Join(parts, "\n")
}

// capture keeps a run's failures until a success shows their fix.
type capture struct {
	inputs     map[string]string // input file name → "name#hash"
	pending    []pending
	candidates []Candidate
	facts      map[string]bool
}

func (c *capture) executed(x agent.Execution, sig Sig, failed bool) {
	if failed {
		if f := fact(sig); f != "" && !c.facts[f] {
			if c.facts == nil {
				c.facts = map[string]bool{}
			}
			c.facts[f] = true
			c.candidates = append(c.candidates, Candidate{Sig: sig, Scope: "global", Fact: f, Packages: Packages(x.Code), Step: x.Step})
		}
		for _, p := range c.pending {
			if p.sig.Text == sig.Text && p.sig.Detail == sig.Detail {
				return // the same failure again: the first one is the one to fix
			}
		}
		p := pending{sig: sig, tool: x.Tool, code: x.Code, step: x.Step}
		if x.Tool == agent.ToolRunShell && x.Files != nil {
			p.files = x.Files()
		}
		if len(c.pending) == 5 {
			c.pending = c.pending[1:]
		}
		c.pending = append(c.pending, p)
		return
	}
	var keep []pending
	var after map[string]string
	for _, p := range c.pending {
		var fix string
		switch {
		case p.tool == agent.ToolRunShell && x.Tool == agent.ToolRunShell && p.files != nil && strings.TrimSpace(p.code) == strings.TrimSpace(x.Code):
			if after == nil {
				after = x.Files()
			}
			fix = filesDiff(p.files, after, 8)
		case p.tool == agent.ToolExecutePython && x.Tool == agent.ToolExecutePython && similar(p.code, x.Code):
			fix = fixDiff(p.code, x.Code, 8)
		default:
			keep = append(keep, p) // an unrelated success: the fix is still to come
			continue
		}
		scope, files := scopeOf(p.sig, p.code+"\n"+x.Code, c.inputs)
		c.candidates = append(c.candidates, Candidate{Sig: p.sig, Scope: scope, Fix: fix, Files: files, Packages: Packages(p.code + "\n" + x.Code), Step: p.step})
	}
	c.pending = keep
}

// learned returns the candidates, one per signature: a fix wins over a bare fact.
func (c *capture) learned() []Candidate {
	var out []Candidate
	idx := map[string]int{}
	for _, cand := range c.candidates {
		k := cand.Sig.Text + "\x00" + cand.Sig.Detail
		if i, ok := idx[k]; ok {
			if out[i].Fix == "" && cand.Fix != "" {
				cand.Fact = out[i].Fact
				out[i] = cand
			}
			continue
		}
		idx[k] = len(out)
		out = append(out, cand)
	}
	return out
}
