package mcpserver

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/kernel"
)

// renderExecution is the compact text a model reads for one cell: status,
// output, result and error, each long part cut in the middle.
func renderExecution(res *kernel.Result, timeout time.Duration, max int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status: %s (execution %d, %s)\n", res.Status, res.ExecutionCount, formatMS(res.DurationMS))
	if why := statusNote(res.Status, timeout); why != "" {
		b.WriteString(why + "\n")
	}
	section(&b, "stdout", res.Stdout, max)
	section(&b, "stderr", res.Stderr, max)
	if res.Truncated {
		b.WriteString("(the sandbox kept only the head and tail of a very long output)\n")
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
		if t, ok := o.Data["text/plain"]; ok {
			section(&b, name, t, max)
		} else if len(o.Data) > 0 {
			section(&b, name, "("+strings.Join(mimeTypes(o.Data), ", ")+")", max)
		}
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

// renderShell is the text for one run_shell call.
func renderShell(sh *ShellOutput, res *kernel.Result, timeout time.Duration, max int) string {
	var b strings.Builder
	switch {
	case sh.ExitCode != nil && *sh.ExitCode < 0:
		fmt.Fprintf(&b, "killed by signal %d (%s)\n", -*sh.ExitCode, formatMS(sh.DurationMS))
	case sh.ExitCode != nil:
		fmt.Fprintf(&b, "exit code %d (%s)\n", *sh.ExitCode, formatMS(sh.DurationMS))
	default:
		fmt.Fprintf(&b, "status: %s (%s)\n", sh.Status, formatMS(sh.DurationMS))
		if why := statusNote(kernel.Status(sh.Status), timeout); why != "" {
			b.WriteString(why + "\n")
		} else if res.Error != nil {
			// Not the command's exit: say what failed instead.
			b.WriteString(res.Error.Name + ": " + res.Error.Value + "\n")
		}
	}
	section(&b, "stdout", sh.Stdout, max)
	section(&b, "stderr", sh.Stderr, max)
	if sh.Truncated {
		b.WriteString("(the sandbox kept only the head and tail of a very long output)\n")
	}
	return strings.TrimRight(b.String(), "\n")
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
	b.WriteString(headTail(text, max))
	if !strings.HasSuffix(text, "\n") {
		b.WriteByte('\n')
	}
}

// headTail keeps the first and last max/2 bytes of s (on character
// boundaries) and says how many bytes it cut between them.
func headTail(s string, max int) string {
	return kernel.CutMiddle(s, max, "\n[... %d bytes cut here; structuredContent has the whole text ...]\n")
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not
// split a character.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func formatMS(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f s", ms/1000)
}

func mimeTypes(data map[string]string) []string {
	var ts []string
	for _, t := range []string{"text/html", "text/markdown", "image/svg+xml", "application/json", "image/jpeg"} {
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

// images returns one image content per PNG output, in order.
func images(res *kernel.Result) []*mcp.ImageContent {
	var out []*mcp.ImageContent
	for _, o := range res.Results {
		b64, ok := o.Data["image/png"]
		if !ok {
			continue
		}
		png, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
		if err != nil {
			continue // the kernel sends valid base64; skip rather than fail the call
		}
		out = append(out, &mcp.ImageContent{MIMEType: "image/png", Data: png})
	}
	return out
}
