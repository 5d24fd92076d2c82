package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/zygote"
)

// The template command end to end: build from a requirements file
// through the egress proxy (a plain-HTTP index on loopback, named in
// --allow), list, show, remove; bad input says what to fix.
func TestTemplateCommand(t *testing.T) {
	wheels := t.TempDir()
	egresstest.BuildWheel(t, wheels, "sandloop-cli-demo", "2.0", "cli")
	ix := httptest.NewServer(egresstest.Index(wheels))
	t.Cleanup(ix.Close)
	port := egresstest.Port(ix)
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sandloop(t, "", "template", "rm", "--templates-dir", dir, "cli")
		os.RemoveAll(dir)
	})
	req := writeFile(t, t.TempDir(), "requirements.txt", "sandloop-cli-demo==2.0\n")
	code, out, errs := sandloop(t, "", "template", "build", "cli", "--templates-dir", dir, "--requirements", req, "--preload", "sandloop_cli_demo",
		"--allow", fmt.Sprintf("127.0.0.1:%d", port), "--pip-index", fmt.Sprintf("http://127.0.0.1:%d/simple/", port))
	if code != 0 || !strings.Contains(out, "template cli") || !strings.Contains(out, "sandloop-cli-demo==2.0") || !strings.Contains(out, "preload  sandloop_cli_demo") {
		t.Fatalf("build: %d\n%s\n%s", code, out, errs)
	}
	if code, out, _ := sandloop(t, "", "template", "ls", "--templates-dir", dir); code != 0 || !strings.Contains(out, "cli ") || !strings.Contains(out, "3.11") {
		t.Errorf("ls: %d %s", code, out)
	}
	if code, out, _ := sandloop(t, "", "template", "show", "--templates-dir", dir, "cli"); code != 0 || !strings.Contains(out, "sandloop-cli-demo==2.0") {
		t.Errorf("show: %d %s", code, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"template", "show", "--templates-dir", dir, "nope"}, "template not found: nope"},
		{[]string{"template", "build", "--templates-dir", dir, "Bad/Name", "--pip", "x"}, "invalid template name"},
		{[]string{"template", "build", "--templates-dir", dir, "empty"}, "nothing to install"},
		{[]string{"template", "build", "--templates-dir", dir, "x", "--pip", "x", "--env", "NOEQUALS"}, "give NAME=VALUE"},
	} {
		if code, _, errs := sandloop(t, "", c.args...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: %d %q, want exit 2 and %q", c.args, code, errs, c.want)
		}
	}
	if code, out, _ := sandloop(t, "", "template", "rm", "--templates-dir", dir, "cli"); code != 0 || !strings.Contains(out, "removed cli") {
		t.Errorf("rm: %d %s", code, out)
	}
	if code, out, _ := sandloop(t, "", "template", "ls", "--templates-dir", dir); code != 0 || !strings.Contains(out, "no templates") {
		t.Errorf("ls after rm: %d %s", code, out)
	}
}

// TestTemplateBuildImageRefusals: template build --image's bad input and
// a malicious image (an OCI layout made here whose layer names a host
// path) exit 2 with what to fix, and nothing is stored.
func TestTemplateBuildImageRefusals(t *testing.T) {
	dir := t.TempDir()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "/etc/cron.d/evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	// From an opener, not LayerFromReader: that buffers the tar in a
	// temporary file of the host's /tmp it never removes.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(t.TempDir(), "evil")
	p, err := layout.Write(evil, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	notImage := writeFile(t, t.TempDir(), "x.tar", "not a tar")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--image", evil}, `image refused: layer 1, entry "/etc/cron.d/evil": an absolute path`},
		{[]string{"--image", filepath.Join(dir, "missing")}, "no such file or directory"},
		{[]string{"--image", notImage}, "is not an image archive"},
		{[]string{"--image", evil, "--pip", "x"}, "--image builds from an image alone"},
		{[]string{"--python", "/usr/bin/python3", "--pip", "x"}, "--python and --max-size go with --image"},
		{[]string{"--image", evil, "--max-size", "lots"}, "give a size such as 2GiB"},
		{[]string{"--image", evil, "--python", "python3"}, "absolute, clean path"},
	} {
		args := append([]string{"template", "build", "--templates-dir", dir, "img"}, c.args...)
		if code, _, errs := sandloop(t, "", args...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: %d %q, want exit 2 and %q", c.args, code, errs, c.want)
		}
	}
	if _, err := os.Stat("/etc/cron.d/evil"); err == nil {
		t.Fatal("the image wrote /etc/cron.d/evil on the host")
	}
	if code, out, _ := sandloop(t, "", "template", "ls", "--templates-dir", dir); code != 0 || !strings.Contains(out, "no templates") {
		t.Errorf("ls after refusals: %d %s", code, out)
	}
}

// TestTemplateFlag: --template puts run, exec, repl, agent and mcp in the
// template's environment (its package imports; the model is told it has
// it); an unknown template is a usage error naming sandloop template ls.
func TestTemplateFlag(t *testing.T) {
	wheels := t.TempDir()
	egresstest.BuildWheel(t, wheels, "sandloop-flag-demo", "3.0", "flagged")
	ix := httptest.NewServer(egresstest.Index(wheels))
	t.Cleanup(ix.Close)
	port := egresstest.Port(ix)
	dir, err := os.MkdirTemp("", "sandloop-templates-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sandloop(t, "", "template", "rm", "--templates-dir", dir, "flag")
		os.RemoveAll(dir)
	})
	if code, out, errs := sandloop(t, "", "template", "build", "flag", "--templates-dir", dir, "--pip", "sandloop-flag-demo",
		"--allow", fmt.Sprintf("127.0.0.1:%d", port), "--pip-index", fmt.Sprintf("http://127.0.0.1:%d/simple/", port)); code != 0 {
		t.Fatalf("build: %d\n%s\n%s", code, out, errs)
	}
	const probe = "import sys, sandloop_flag_demo; print(sandloop_flag_demo.VALUE, sys.prefix)"
	want := "flagged /opt/sandloop/env"

	if code, out, errs := sandloop(t, "", "exec", "--template", "flag", "--templates-dir", dir, "-c", probe); code != 0 || !strings.Contains(out, want) {
		t.Errorf("exec --template: %d %q %q", code, out, errs)
	}
	if code, out, _ := sandloop(t, "", "exec", "--templates-dir", dir, "-c", "import sandloop_flag_demo"); code == 0 || strings.Contains(out, "flagged") {
		t.Errorf("exec without --template imports the template's package: %d", code)
	}
	script := writeFile(t, t.TempDir(), "probe.py", probe+"\nimport subprocess; subprocess.run(['python3', '-c', 'import sandloop_flag_demo'], check=True); print('child ok')\n")
	if code, out, errs := sandloop(t, "", "run", "--template", "flag", "--templates-dir", dir, script); code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "child ok") {
		t.Errorf("run --template: %d %q %q", code, out, errs)
	}
	if code, out, errs := sandloop(t, probe+"\n", "repl", "--template", "flag", "--templates-dir", dir, "--history", ""); code != 0 || !strings.Contains(out, want) {
		t.Errorf("repl --template: %d %q %q", code, out, errs)
	}

	srv := useModel(t, llmtest.Script{
		{ToolCalls: tc("execute_python", `{"code":"`+probe+`"}`)},
		{ToolCalls: tc("finish", `{"summary":"printed it"}`)},
	})
	if code, out, errs := sandloop(t, "", "agent", "print the package's value", "--template", "flag", "--templates-dir", dir, "--data-dir", t.TempDir()); code != 0 {
		t.Errorf("agent --template: %d\n%s\n%s", code, out, errs)
	} else if reqs := srv.Requests(); !strings.Contains(reqs[0].System(), "sandloop-flag-demo 3.0") || !strings.Contains(reqs[1].ToolResults()[0].Text, want) {
		t.Errorf("agent --template: system prompt %q; result %+v", reqs[0].System(), reqs[1].ToolResults())
	}

	ctx := context.Background()
	cmd := cliCommand(ctx, "mcp", "--template", "flag", "--templates-dir", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("mcp connect: %v\n%s", err, stderr.String())
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": probe}})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, want) {
		t.Errorf("mcp --template: %+v\n%s", res.Content, stderr.String())
	}
	cs.Close()

	// doctor lists the templates and whether each can fork: one whose
	// preload cannot import cannot (its manifest edited by hand here).
	b, err := os.ReadFile(filepath.Join(dir, "names", "flag.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(b, &m)
	m["name"], m["preload"] = "broken", []string{"no_such_module_here"}
	b, _ = json.Marshal(m)
	if err := os.WriteFile(filepath.Join(dir, "names", "broken.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(dir, "names", "broken.json")) })
	_, out, _ := sandloop(t, "", "doctor", "--templates-dir", dir)
	wantLines := []string{"templates         2 in " + dir, "broken", "cannot fork"}
	if zygote.Supported() == nil {
		wantLines = append(wantLines, "ok      flag", "forks: its zygote was ready in", "no_such_module_here")
	}
	for _, w := range wantLines {
		if !strings.Contains(out, w) {
			t.Errorf("doctor lacks %q:\n%s", w, out)
		}
	}

	for _, verb := range [][]string{{"exec", "-c", "1"}, {"run", script}, {"repl"}, {"mcp"}, {"agent", "x"}} {
		args := append(append([]string{}, verb[0], "--template", "nope", "--templates-dir", dir), verb[1:]...)
		if code, _, errs := sandloop(t, "", args...); code != 2 || !strings.Contains(errs, "sandloop template ls") || !strings.Contains(errs, "nope") {
			t.Errorf("%s --template nope: %d %q", verb[0], code, errs)
		}
	}
}
