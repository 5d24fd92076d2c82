package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/e2b/e2btest"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/testutil"
)

// The agent frameworks that reach a sandbox through E2B's SDK, driven
// unchanged (internal/e2b/testdata/frameworks, pinned by its lock file)
// against a real `sandloop serve`, each by a script that prints its checks.
// checks is how many the script reports; pending names the checks that
// wait for a feature sandloop lacks: such a check is skipped while it
// fails, naming the feature, and passes as soon as the feature is there
// (then remove it from pending).
var frameworks = []struct {
	name, script string
	checks       int
	pending      map[string]string
}{
	{"OpenAIAgents", "openai-agents.mjs", 12, map[string]string{}},
	{"Mastra", "mastra.mjs", 13, map[string]string{}},
	{"ComputeSDK", "computesdk.mjs", 7, map[string]string{}},
	{"DeepAgents", "deepagents.mjs", 15, map[string]string{}},
}

// TestFrameworks runs each framework's script against its own serve and a
// scripted model, reports each of its checks as a subtest, and then checks
// that no process of its sandboxes is left.
func TestFrameworks(t *testing.T) {
	e2btest.Frameworks(t)
	for _, fw := range frameworks {
		if only := os.Getenv("SANDLOOP_FRAMEWORK"); only != "" && only != fw.name {
			continue
		}
		t.Run(fw.name, func(t *testing.T) {
			serve, env, _ := startServeCmd(t, "--token", e2bTestToken, "--pool", "0")
			idle := descendants(serve.Process.Pid)
			model := llmtest.NewOpenAIServerFunc(t, scriptedModel)
			marker := fmt.Sprintf("sandloop-fw-%d", time.Now().UnixNano())
			run, err := e2btest.RunFramework(t, env, model.URL, marker, 10*time.Minute, fw.script)
			if err != nil || !run.Done || len(run.Checks) != fw.checks {
				t.Errorf("node %s: %v; reached its end: %v; %d checks, want %d\n%s", fw.script, err, run.Done, len(run.Checks), fw.checks, run.Output)
			} else if testing.Verbose() {
				t.Logf("node %s:\n%s", fw.script, run.Output)
			}
			for _, c := range run.Checks {
				t.Run(c.Name, func(t *testing.T) {
					switch feature, ok := fw.pending[c.Name]; {
					case c.OK && ok:
						t.Logf("passes now: remove it from pending (%s)", feature)
					case c.OK:
					case ok:
						t.Skipf("waits for %s: %s", feature, c.Error)
					default:
						t.Error(c.Error)
					}
				})
			}
			// No sandbox is left, nor any process of one: the serve is back
			// to the processes it had before the script but for the zygote's
			// (the template and its spares, which the server keeps and
			// refills; a session left behind shows in the list), and none
			// carries the marker.
			if left := listSandboxes(t, env); left != "[]" {
				t.Errorf("sandboxes left after %s: %s", fw.script, left)
			}
			testutil.WaitFor(t, 60*time.Second, func() error {
				var left []int
				procs := descendants(serve.Process.Pid)
				// A template's warm zygote (Mastra builds one) runs in a
				// jail of its own: its init is the zygote's parent.
				zygoteJails := map[int]bool{}
				for pid := range procs {
					if cmdline(pid) == zygoteCmdline {
						zygoteJails[parentPid(pid)] = true
					}
				}
				for pid := range procs {
					if !idle[pid] && cmdline(pid) != zygoteCmdline && !zygoteJails[pid] {
						left = append(left, pid)
					}
				}
				left = append(left, testutil.PidsWithArg(marker)...)
				if len(left) > 0 {
					return fmt.Errorf("processes left behind by %s's sandboxes: %s", fw.name, describe(left))
				}
				return nil
			})
		})
	}
}

const zygoteCmdline = "python3 /opt/sandloop/zygote.py"

// cmdline is pid's command line, its arguments joined by spaces.
func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
}

// listSandboxes is the server's answer to E2B's list of sandboxes.
func listSandboxes(t *testing.T, env e2btest.Env) string {
	req, _ := http.NewRequest("GET", env.URL+"/v2/sandboxes", nil)
	req.Header.Set("X-API-KEY", env.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// descendants are the processes below pid, found by their parents in /proc.
// parentPid is pid's parent, 0 if it is gone.
func parentPid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	pp, _ := strconv.Atoi(f[1])
	return pp
}

func descendants(pid int) map[int]bool {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The command in parentheses may hold spaces: the fields follow its last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	out := map[int]bool{}
	for changed := true; changed; {
		changed = false
		for p, pp := range parent {
			if !out[p] && (pp == pid || out[pp]) {
				out[p], changed = true, true
			}
		}
	}
	return out
}

// describe lists pids with their command lines.
func describe(pids []int) string {
	sort.Ints(pids)
	var b strings.Builder
	for _, p := range pids {
		// A zombie has no command line: its stat names it and says Z.
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		fmt.Fprintf(&b, "\n  %d %s [%s]", p, cmdline(p), strings.TrimSpace(string(stat)))
	}
	return b.String()
}

var callIDs atomic.Int64

var callRE = regexp.MustCompile(`(?m)^CALL (\S+) (.*)$`)

// scriptedModel is the model of the framework scripts: the last user
// message lists the tool calls to make ("CALL name {json args}", one a
// line, written by check.mjs's call()); the model makes them one per turn,
// then answers "RESULT " and the last tool result, so the script can check
// what the tools did. A tool the request does not offer is answered in
// text, naming those it does.
func scriptedModel(r llmtest.Request) llmtest.Turn {
	var b struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Tools []struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	if err := r.Decode(&b); err != nil {
		return llmtest.Turn{Text: "MODEL: cannot read the request: " + err.Error()}
	}
	lastUser, results, lastResult := -1, 0, ""
	for i, m := range b.Messages {
		switch m.Role {
		case "user":
			lastUser, results = i, 0
		case "tool":
			results++
			lastResult = text(m.Content)
		}
	}
	if lastUser < 0 {
		return llmtest.Turn{Text: "MODEL: no user message"}
	}
	calls := callRE.FindAllStringSubmatch(text(b.Messages[lastUser].Content), -1)
	if results >= len(calls) {
		if len(calls) == 0 {
			return llmtest.Turn{Text: "RESULT (no calls asked)"}
		}
		return llmtest.Turn{Text: "RESULT " + lastResult}
	}
	name, args := calls[results][1], calls[results][2]
	var offered []string
	for _, t := range b.Tools {
		if t.Function.Name == name {
			// Call ids are unique across the run: SDKs refuse one reused.
			id := fmt.Sprintf("call_%d_%d", results+1, callIDs.Add(1))
			return llmtest.Turn{ToolCalls: []llmtest.ToolCall{{ID: id, Name: name, Arguments: args}}, ChunkSize: 64}
		}
		offered = append(offered, t.Function.Name)
	}
	return llmtest.Turn{Text: fmt.Sprintf("MODEL: no tool %s among %v", name, offered)}
}

// text is a message's content as text, whether a string or a list of parts.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var out []string
	for _, p := range parts {
		out = append(out, p.Text)
	}
	return strings.Join(out, "\n")
}
