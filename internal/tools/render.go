package tools

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
)

// Render is the compact text a model reads of one execution: status,
// output, results and error, each long part cut in the middle (max bytes
// each). A result shows its text/plain, else its markdown or JSON, else
// the names of its types; a figure's text is left out next to its image.
// timeout is the call's limit, for the note on a timed-out execution.
func Render(res *kernel.Result, timeout time.Duration, max int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s (execution %d, %s)\n", res.Status, res.ExecutionCount, formatMS(res.DurationMS))
	cost(&b, res)
	if why := statusNote(res.Status, timeout); why != "" {
		b.WriteString(why + "\n")
	}
	section(&b, "stdout", res.Stdout, max)
	section(&b, "stderr", res.Stderr, max)
	if res.Truncated {
		b.WriteString(truncatedNote + "\n")
	}
	nimg := 0
	for _, o := range res.Results {
		if _, ok := o.Data["image/png"]; ok {
			nimg++
			if !o.IsMainResult {
				continue // the image says it all; matplotlib's text is "<Figure ...>"
			}
		}
		name := "display"
		if o.IsMainResult {
			name = "result"
		}
		section(&b, name, bestText(o.Data), max)
	}
	if e := res.Error; e != nil {
		tb := e.Traceback
		if tb == "" {
			tb = e.Name + ": " + e.Value
		}
		section(&b, "error", tb, max)
	}
	if nimg > 0 {
		fmt.Fprintf(&b, "[%d image(s) attached as image/png]\n", nimg)
	}
	return strings.TrimRight(b.String(), "\n")
}

// RenderShell is the text for one run_shell call: the command's exit code
// (or why it has none), then its output.
func RenderShell(sh *ShellOutput, res *kernel.Result, timeout time.Duration, max int) string {
	var b strings.Builder
	switch {
	case sh.ExitCode != nil && *sh.ExitCode < 0:
		fmt.Fprintf(&b, "killed by signal %d (status: %s, %s)\n", -*sh.ExitCode, sh.Status, formatMS(sh.DurationMS))
	case sh.ExitCode != nil:
		fmt.Fprintf(&b, "exit code %d (status: %s, %s)\n", *sh.ExitCode, sh.Status, formatMS(sh.DurationMS))
	default:
		fmt.Fprintf(&b, "status: %s (%s)\n", sh.Status, formatMS(sh.DurationMS))
		cost(&b, res)
		if why := statusNote(kernel.Status(sh.Status), timeout); why != "" {
			b.WriteString(why + "\n")
		} else if res.Error != nil {
			// Not the command's exit: say what failed instead.
			b.WriteString(res.Error.Name + ": " + res.Error.Value + "\n")
		}
	}
	if sh.ExitCode != nil {
		cost(&b, res)
	}
	section(&b, "stdout", sh.Stdout, max)
	section(&b, "stderr", sh.Stderr, max)
	if sh.Truncated {
		b.WriteString(truncatedNote + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// cost says what an execution used, as the sandbox's cgroup measured it
// ("cost: 0.81 s CPU, peak 69 MiB memory"), so a model can reason about
// speed and memory; nothing where nothing was measured.
func cost(b *strings.Builder, res *kernel.Result) {
	if res == nil || res.CPUMS <= 0 && res.MemoryPeakBytes <= 0 {
		return
	}
	var parts []string
	if res.CPUMS > 0 {
		parts = append(parts, formatMS(res.CPUMS)+" CPU")
	}
	if res.MemoryPeakBytes > 0 {
		parts = append(parts, "peak "+formatBytes(res.MemoryPeakBytes)+" memory")
	}
	b.WriteString("cost: " + strings.Join(parts, ", ") + "\n")
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 10<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", max(n>>10, 1))
}

func statusNote(st kernel.Status, timeout time.Duration) string {
	switch st {
	case kernel.StatusTimeout:
		return fmt.Sprintf("The code ran longer than its timeout of %s and was interrupted; variables are kept. Pass a larger timeout_s or make it faster.", timeout)
	case kernel.StatusInterrupted:
		return "The code was interrupted (the call was cancelled); variables are kept."
	case kernel.StatusKilled:
		return "The sandbox was killed (out of memory, or it crashed): Python variables are gone; the next call starts a fresh kernel, files are kept."
	}
	return ""
}

func section(b *strings.Builder, name, text string, max int) {
	if text == "" {
		return
	}
	b.WriteString("--- " + name + " ---\n")
	b.WriteString(CutMiddle(text, max))
	if !strings.HasSuffix(text, "\n") {
		b.WriteByte('\n')
	}
}

// CutMiddle keeps the first and last max/2 bytes of s (on character
// boundaries) and says how many bytes it cut between them.
func CutMiddle(s string, max int) string {
	return kernel.CutMiddle(s, max, "\n[... %d bytes cut here ...]\n")
}

const (
	truncatedNote = "(the sandbox kept only the head and tail of a very long output)"
	cutNote       = " bytes cut here ...]" // the end of CutMiddle's mark
)

// LeavesOut reports whether a rendered result (Render, RenderShell) leaves
// out part of the execution's output, cut in the middle to the model's
// share or by the sandbox's capture limit: whoever shows it then says
// where the rest is.
func LeavesOut(text string) bool {
	return strings.Contains(text, cutNote) || strings.Contains(text, truncatedNote)
}

func formatMS(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f s", ms/1000)
}

// bestText picks the best text form of a displayed value: text/plain,
// else markdown, else JSON, else the names of its types.
func bestText(data map[string]string) string {
	for _, k := range []string{"text/plain", "text/markdown", "application/json"} {
		if v, ok := data[k]; ok {
			return v
		}
	}
	if len(data) == 0 {
		return ""
	}
	return "(" + strings.Join(mimeTypes(data), ", ") + ")"
}

func mimeTypes(data map[string]string) []string {
	var ts []string
	for _, t := range []string{"text/html", "image/svg+xml", "image/jpeg", "image/png"} {
		if _, ok := data[t]; ok {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		for t := range data {
			ts = append(ts, t)
		}
		sort.Strings(ts)
	}
	return ts
}

// PNGs returns the PNG images of a result (base64), in order.
func PNGs(res *kernel.Result) []string {
	var out []string
	for _, o := range res.Results {
		if p := o.Data["image/png"]; p != "" {
			out = append(out, p)
		}
	}
	return out
}

// images returns one image per PNG output, decoded, in order.
func images(res *kernel.Result) []Image {
	var out []Image
	for _, b64 := range PNGs(res) {
		png, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil {
			continue // the kernel sends valid base64; skip rather than fail the call
		}
		out = append(out, Image{MIMEType: "image/png", Data: png})
	}
	return out
}

// withoutImages is res for structuredContent: images travel once, as image
// content, not a second time as base64 inside the structured result.
func withoutImages(res *kernel.Result) *kernel.Result {
	out := *res
	out.Results = make([]kernel.Output, 0, len(res.Results))
	for _, o := range res.Results {
		if _, ok := o.Data["image/png"]; ok {
			d := make(map[string]string, len(o.Data))
			for k, v := range o.Data {
				if k != "image/png" {
					d[k] = v
				}
			}
			o.Data = d
		}
		out.Results = append(out.Results, o)
	}
	return &out
}
