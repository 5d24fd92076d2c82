package lessons

import (
	"path"
	"regexp"
	"strings"

	"github.com/sandloop/sandloop/internal/kernel"
)

// Sig is a failing execution's error made generic, so that the same
// mistake made again, with other paths, line numbers, addresses or names,
// is recognised.
type Sig struct {
	// Name is the exception's type ("KeyError"), or "Timeout"/"Killed".
	Name string
	// Text is Name and the normalized message: "KeyError: <q>".
	Text string
	// Detail holds the short identifiers the normalization took out of the
	// message, in order ("DataFrame append"): two lessons of one shape
	// (every KeyError) differ by them.
	Detail string
	// Message is the raw message (never stored: it may hold data).
	Message string
}

var (
	reQuoted  = regexp.MustCompile(`'[^'\n]*'|"[^"\n]*"`)
	reURL     = regexp.MustCompile(`\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'"]+`)
	reAddr    = regexp.MustCompile(`\b0x[0-9a-fA-F]+\b`)
	rePath    = regexp.MustCompile(`(?:\.{0,2}/[^\s:,;'"()\[\]]+)+`)
	reNumber  = regexp.MustCompile(`[-+]?\b\d+(?:\.\d+)?(?:e[-+]?\d+)?\b`)
	reSpace   = regexp.MustCompile(`\s+`)
	reIdent   = regexp.MustCompile(`^[A-Za-z_][\w.-]{0,47}$`)
	reErrLine = regexp.MustCompile(`^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|NotFound))(?::\s*(.*))?$`)
)

// Normalize makes an error message generic: URLs, addresses, paths,
// quoted strings and numbers become placeholders. It returns the generic
// message and the identifiers taken out of quotes (a quoted path gives its
// base name).
func Normalize(msg string) (string, []string) {
	var detail []string
	seen := map[string]bool{}
	keep := func(s string) {
		if reIdent.MatchString(s) && !seen[s] {
			seen[s] = true
			detail = append(detail, s)
		}
	}
	s := reURL.ReplaceAllString(msg, "<url>")
	s = reQuoted.ReplaceAllStringFunc(s, func(q string) string {
		inner := q[1 : len(q)-1]
		if strings.Contains(inner, "/") {
			keep(path.Base(inner))
		} else {
			keep(inner)
		}
		return "<q>"
	})
	s = reAddr.ReplaceAllString(s, "<addr>")
	s = rePath.ReplaceAllString(s, "<path>")
	s = reNumber.ReplaceAllString(s, "<n>")
	s = strings.TrimSpace(reSpace.ReplaceAllString(s, " "))
	if len(s) > 200 {
		s = s[:200]
	}
	return s, detail
}

// SignatureOf returns the signature of a failed execution, or false if it
// did not fail. For run_shell, whose error only says the exit status, the
// program's own last error line in its output is used.
func SignatureOf(tool string, res *kernel.Result) (Sig, bool) {
	if res == nil {
		return Sig{}, false
	}
	switch res.Status {
	case kernel.StatusOK:
		return Sig{}, false
	case kernel.StatusTimeout:
		return Sig{Name: "Timeout", Text: "Timeout: the execution hit its time limit"}, true
	case kernel.StatusKilled:
		return Sig{Name: "Killed", Text: "Killed: the Python process died (out of memory?)"}, true
	}
	name, msg := "", ""
	if res.Error != nil {
		name, msg = res.Error.Name, res.Error.Value
	}
	if name == "" || name == "CommandFailed" || strings.HasSuffix(name, "CalledProcessError") {
		if n, m, ok := lastErrorLine(res.Stderr + "\n" + res.Stdout); ok {
			name, msg = n, m
		}
	}
	if name == "" {
		name = "Error"
	}
	return makeSig(name, msg), true
}

func makeSig(name, msg string) Sig {
	norm, detail := Normalize(msg)
	text := name
	if norm != "" {
		text += ": " + norm
	}
	return Sig{Name: name, Text: text, Detail: strings.Join(detail, " "), Message: msg}
}

// lastErrorLine finds the last "SomeError: message" line of a program's
// output (a traceback's last line).
func lastErrorLine(out string) (string, string, bool) {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if m := reErrLine.FindStringSubmatch(strings.TrimSpace(lines[i])); m != nil {
			name := m[1]
			if j := strings.LastIndexByte(name, '.'); j >= 0 {
				name = name[j+1:] // "pandas.errors.ParserError" → as Python's kernel names it
			}
			return name, m[2], true
		}
	}
	return "", "", false
}

var reImport = regexp.MustCompile(`(?m)^\s*(?:from\s+([A-Za-z_][\w.]*)\s+import\b|import\s+([A-Za-z_][\w., ]*))`)

// Packages returns the top-level modules code imports, in order.
func Packages(code string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(m string) {
		m = strings.TrimSpace(m)
		if i := strings.IndexByte(m, ' '); i >= 0 { // "numpy as np"
			m = m[:i]
		}
		if i := strings.IndexByte(m, '.'); i >= 0 {
			m = m[:i]
		}
		if m != "" && !seen[m] && len(out) < 8 {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, m := range reImport.FindAllStringSubmatch(code, -1) {
		if m[1] != "" {
			add(m[1])
			continue
		}
		for _, part := range strings.Split(m[2], ",") {
			add(part)
		}
	}
	return out
}
