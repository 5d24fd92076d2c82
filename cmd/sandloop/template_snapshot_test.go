package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandloop/sandloop/client"
)

// template build --from-snapshot end to end: a snapshot taken through a
// serve becomes a template (the snapshot's owner named by --token); a
// session of it, created over HTTP, has the snapshot's file and variable
// and says so in `restored`; show lists them; another token's build is
// refused as not found; a corrupted store's build is an error that says so.
func TestTemplateFromSnapshotCommand(t *testing.T) {
	const token = "tsnap-token-aaaaaaaaaaaa"
	store, tdir := t.TempDir(), t.TempDir()
	_, env, _ := startServeCmd(t, "--pool", "0", "--token", token, "--snapshot-store", store, "--templates-dir", tdir)
	c, _ := client.New(env.URL, &client.Options{Token: token})
	ctx := context.Background()
	s, err := c.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.Execute(ctx, s.ID, "answer = 41\nopen('notes.txt','w').write('configured')", nil); err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	snap, err := c.Snapshot(ctx, s.ID, "configured")
	if err != nil {
		t.Fatal(err)
	}

	build := func(name, tok string) (int, string, string) {
		return sandloop(t, "", "template", "build", name, "--from-snapshot", snap.ID, "--snapshot-store", store, "--templates-dir", tdir, "--token", tok)
	}
	if code, out, errOut := build("configured", token); code != 0 || !strings.Contains(out, "from     snapshot "+snap.ID) || !strings.Contains(out, "variables answer") {
		t.Fatalf("build: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, _, errOut := build("other", "someone-elses-token-bbbb"); code != 2 || !strings.Contains(errOut, "snapshot not found") {
		t.Errorf("build with another token: exit %d %s", code, errOut)
	}
	if code, _, errOut := sandloop(t, "", "template", "build", "x", "--from-snapshot", "snap-NOPE", "--snapshot-store", store, "--templates-dir", tdir); code != 2 || !strings.Contains(errOut, "not a snapshot id") {
		t.Errorf("a malformed snapshot id: exit %d %s", code, errOut)
	}
	if code, _, errOut := sandloop(t, "", "template", "build", "x", "--from-snapshot", snap.ID, "--pip", "numpy", "--templates-dir", tdir); code != 2 || !strings.Contains(errOut, "drop --image") {
		t.Errorf("--from-snapshot with --pip: exit %d %s", code, errOut)
	}
	if code, out, _ := sandloop(t, "", "template", "show", "configured", "--templates-dir", tdir); code != 0 || !strings.Contains(out, "files    1") || !strings.Contains(out, "variables answer") {
		t.Errorf("show: exit %d\n%s", code, out)
	}

	req, _ := http.NewRequest("POST", env.URL+"/v1/sessions", bytes.NewReader([]byte(`{"template": "configured"}`)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		ID       string `json:"id"`
		Restored *struct {
			From      string   `json:"from"`
			Files     int      `json:"files"`
			Variables []string `json:"variables"`
		} `json:"restored"`
	}
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	if resp.StatusCode != 201 && resp.StatusCode != 200 || created.Restored == nil || created.Restored.From != "template configured" || created.Restored.Files != 1 {
		t.Fatalf("create from the template: %d %+v", resp.StatusCode, created.Restored)
	}
	r, err := c.Execute(ctx, created.ID, "print(answer + 1, open('notes.txt').read())", nil)
	if err != nil || !strings.Contains(r.Stdout, "42 configured") {
		t.Fatalf("a session of the template: %+v %v", r, err)
	}

	req, _ = http.NewRequest("GET", env.URL+"/v1/templates/configured", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var shown struct {
		FromSnapshot *struct {
			Files     int      `json:"files"`
			Variables []string `json:"variables"`
		} `json:"from_snapshot"`
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	json.Unmarshal(raw, &shown)
	if shown.FromSnapshot == nil || shown.FromSnapshot.Files != 1 || !slices.Contains(shown.FromSnapshot.Variables, "answer") || strings.Contains(string(raw), snap.ID) {
		t.Errorf("GET /v1/templates/configured: %s", raw)
	}

	// exec --template (a script, no kernel) gets the files, and is told
	// the variables are not loaded.
	if code, out, errOut := sandloop(t, "", "exec", "--template", "configured", "--templates-dir", tdir, "-c", "print('SEE', open('notes.txt').read(), 'answer' in dir())"); code != 0 || !strings.Contains(out, "SEE configured False") || !strings.Contains(errOut, "variables (answer") {
		t.Errorf("exec --template: exit %d\n%s\n%s", code, out, errOut)
	}
}
