package tools

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandloop/sandloop/internal/kernel"
)

func TestCutMiddle(t *testing.T) {
	tests := []struct {
		in        string
		max       int
		head, cut string
		tail      string
	}{
		{"short", 10, "short", "", ""},
		{strings.Repeat("a", 50) + strings.Repeat("b", 50), 20, strings.Repeat("a", 10), "[... 80 bytes cut here", strings.Repeat("b", 10)},
		// é is two bytes: the cut never splits it.
		{strings.Repeat("é", 20), 9, "éé", "[... 32 bytes cut here", "éé"},
	}
	for _, tt := range tests {
		got := CutMiddle(tt.in, tt.max)
		if !utf8.ValidString(got) {
			t.Errorf("CutMiddle(%q, %d) split a character: %q", tt.in, tt.max, got)
		}
		if tt.cut == "" {
			if got != tt.in {
				t.Errorf("CutMiddle(%q) = %q, want it unchanged", tt.in, got)
			}
			continue
		}
		if !strings.HasPrefix(got, tt.head+"\n"+tt.cut) || !strings.HasSuffix(got, "...]\n"+tt.tail) {
			t.Errorf("CutMiddle(%q, %d) = %q", tt.in, tt.max, got)
		}
	}
}

func TestRenderExecution(t *testing.T) {
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\nfake"))
	res := &kernel.Result{
		Status:          kernel.StatusError,
		Stdout:          strings.Repeat("x", 100) + "END\n",
		Stderr:          "warn\n",
		ExecutionCount:  3,
		DurationMS:      1500,
		CPUMS:           812,
		MemoryPeakBytes: 69 << 20,
		Results: []kernel.Output{
			{Data: map[string]string{"image/png": png, "text/plain": "<Figure size 640x480 with 1 Axes>"}},
			{Data: map[string]string{"text/plain": "shown", "text/html": "<b>shown</b>"}},
			{IsMainResult: true, Data: map[string]string{"text/plain": "42"}},
		},
		Error: &kernel.Exception{Name: "ValueError", Value: "bad", Traceback: "Traceback (most recent call last):\n  File \"<cell 3>\", line 1\nValueError: bad\n"},
	}
	got := Render(res, time.Second, 40)
	for _, want := range []string{
		"status: error (execution 3, 1.50 s)\ncost: 812.0 ms CPU, peak 69 MiB memory\n",
		"--- stdout ---\n" + strings.Repeat("x", 20) + "\n[... 64 bytes cut here",
		"END\n--- stderr ---\nwarn\n",
		"--- display ---\nshown\n",
		"--- result ---\n42\n",
		"--- error ---\nTraceback",
		"ValueError: bad\n[1 image(s) attached as image/png]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendering lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "<Figure") {
		t.Errorf("a figure's text repr should not be shown next to its image:\n%s", got)
	}
	imgs := images(res)
	if len(imgs) != 1 || imgs[0].MIMEType != "image/png" || string(imgs[0].Data) != "\x89PNG\r\n\x1a\nfake" {
		t.Errorf("images: %v", imgs)
	}

	if unmeasured := Render(&kernel.Result{Status: kernel.StatusOK}, time.Second, 40); strings.Contains(unmeasured, "cost:") {
		t.Errorf("a cost line where nothing was measured:\n%s", unmeasured)
	}

	// Whoever shows a rendering knows when it leaves output out.
	whole := Render(&kernel.Result{Status: kernel.StatusOK, Stdout: "short\n"}, time.Second, 40)
	capped := Render(&kernel.Result{Status: kernel.StatusOK, Stdout: "short\n", Truncated: true}, time.Second, 40)
	if !LeavesOut(got) || !LeavesOut(capped) || LeavesOut(whole) {
		t.Errorf("LeavesOut: cut %v, capped by the sandbox %v, whole %v", LeavesOut(got), LeavesOut(capped), LeavesOut(whole))
	}

	timeout := Render(&kernel.Result{Status: kernel.StatusTimeout}, 2*time.Second, 40)
	if !strings.Contains(timeout, "timeout of 2s") || !strings.Contains(timeout, "variables are kept") {
		t.Errorf("timeout rendering: %s", timeout)
	}
}

func TestShellOutput(t *testing.T) {
	tests := []struct {
		res  kernel.Result
		exit int // -1000: none
		text string
	}{
		{kernel.Result{Status: kernel.StatusOK, Stdout: "hi\n"}, 0, "exit code 0"},
		{kernel.Result{Status: kernel.StatusError, Error: &kernel.Exception{Name: "subprocess.CalledProcessError", Value: "Command 'x' returned non-zero exit status 2."}}, 2, "exit code 2"},
		{kernel.Result{Status: kernel.StatusError, Error: &kernel.Exception{Name: "subprocess.CalledProcessError", Value: "Command 'x' died with <Signals.SIGKILL: 9>."}}, -9, "killed by signal 9"},
		{kernel.Result{Status: kernel.StatusTimeout}, -1000, "timeout of 1s"},
		{kernel.Result{Status: kernel.StatusKilled, Error: &kernel.Exception{Name: "KernelDied", Value: "oom"}}, -1000, "sandbox was killed"},
	}
	for _, tt := range tests {
		sh := shellOutput(&tt.res)
		switch {
		case tt.exit == -1000 && sh.ExitCode != nil:
			t.Errorf("%+v: exit code %d, want none", tt.res, *sh.ExitCode)
		case tt.exit != -1000 && (sh.ExitCode == nil || *sh.ExitCode != tt.exit):
			t.Errorf("%+v: exit code %v, want %d", tt.res, sh.ExitCode, tt.exit)
		}
		if got := RenderShell(sh, &tt.res, time.Second, 100); !strings.Contains(got, tt.text) {
			t.Errorf("%+v: text %q lacks %q", tt.res, got, tt.text)
		}
	}
}

func TestWorkspacePath(t *testing.T) {
	for in, want := range map[string]string{"": ".", "/workspace": ".", "/workspace/a/b.txt": "a/b.txt", "a//b": "a/b", "./a": "a"} {
		if got, err := workspacePath(in); err != nil || got != want {
			t.Errorf("workspacePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/etc/passwd", "../x", "a/../../x", "/workspace/../etc"} {
		if got, err := workspacePath(in); err == nil {
			t.Errorf("workspacePath(%q) = %q, want an error", in, got)
		}
	}
}

// TestRenderFallbacks: a result without text/plain shows its markdown,
// else its JSON, else the names of its types.
func TestRenderFallbacks(t *testing.T) {
	for _, tt := range []struct {
		data map[string]string
		want string
	}{
		{map[string]string{"text/plain": "plain", "text/markdown": "*md*"}, "--- result ---\nplain"},
		{map[string]string{"text/markdown": "*md*", "application/json": "{}"}, "--- result ---\n*md*"},
		{map[string]string{"application/json": `{"a": 1}`, "text/html": "<b>"}, "--- result ---\n{\"a\": 1}"},
		{map[string]string{"text/html": "<b>", "image/svg+xml": "<svg/>"}, "--- result ---\n(text/html, image/svg+xml)"},
	} {
		got := Render(&kernel.Result{Status: kernel.StatusOK, Results: []kernel.Output{{IsMainResult: true, Data: tt.data}}}, time.Second, 100)
		if !strings.Contains(got, tt.want) {
			t.Errorf("%v: %q lacks %q", tt.data, got, tt.want)
		}
	}
}
