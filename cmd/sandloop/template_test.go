package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandloop/sandloop/internal/egress/egresstest"
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
	layer, err := tarball.LayerFromReader(bytes.NewReader(b.Bytes()))
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
