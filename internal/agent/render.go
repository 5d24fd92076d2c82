package agent

import (
	"fmt"
	"sort"
	"strings"

	"github.com/sandloop/sandloop/internal/kernel"
)

// cutMiddle keeps the start and end of s (max bytes in all) and says how
// much was cut between them.
func cutMiddle(s string, max int) string {
	return kernel.CutMiddle(s, max, "\n... [%d bytes cut from the middle; the full output is in the run's history] ...\n")
}

// renderResult is what the model reads of an execution: status, output cut
// in the middle, the main result's text, and the whole traceback.
func renderResult(r *kernel.Result, maxOutput int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s", r.Status)
	switch r.Status {
	case kernel.StatusTimeout:
		b.WriteString(" (the execution hit its time limit and was interrupted; variables are kept)")
	case kernel.StatusKilled:
		b.WriteString(" (the Python process died; its variables are lost, files in the workspace are kept)")
	}
	fmt.Fprintf(&b, "\nduration: %.0f ms", r.DurationMS)
	if r.Stdout != "" {
		b.WriteString("\n--- stdout ---\n")
		b.WriteString(cutMiddle(r.Stdout, maxOutput))
	}
	if r.Stderr != "" {
		b.WriteString("\n--- stderr ---\n")
		b.WriteString(cutMiddle(r.Stderr, maxOutput))
	}
	if r.Truncated {
		b.WriteString("\n(the sandbox itself also cut the middle of a very long output)")
	}
	images := 0
	for _, o := range r.Results {
		if _, ok := o.Data["image/png"]; ok {
			images++
		}
		if !o.IsMainResult {
			continue
		}
		b.WriteString("\n--- result ---\n")
		b.WriteString(cutMiddle(mainText(o.Data), maxOutput))
	}
	for _, o := range r.Results {
		if !o.IsMainResult && o.Data["image/png"] == "" {
			if t := mainText(o.Data); t != "" {
				b.WriteString("\n--- display ---\n")
				b.WriteString(cutMiddle(t, maxOutput/2))
			}
		}
	}
	if images > 0 {
		fmt.Fprintf(&b, "\n(%d image(s) produced, attached)", images)
	}
	if r.Error != nil {
		fmt.Fprintf(&b, "\n--- error ---\n%s: %s\n", r.Error.Name, r.Error.Value)
		b.WriteString(r.Error.Traceback)
	}
	return strings.TrimRight(b.String(), "\n")
}

// mainText picks the best text form of a displayed value.
func mainText(data map[string]string) string {
	for _, k := range []string{"text/plain", "text/markdown", "application/json"} {
		if v, ok := data[k]; ok {
			return v
		}
	}
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return "(" + strings.Join(keys, ", ") + ")"
}

// PNGs returns the PNG images of a result (base64), in order: the
// figures the model sees and the CLI writes out.
func PNGs(r *kernel.Result) []string {
	var out []string
	for _, o := range r.Results {
		if p := o.Data["image/png"]; p != "" {
			out = append(out, p)
		}
	}
	return out
}
