package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandloop/sandloop/internal/template"
)

// E2B's template API (the SDKs' Template.build and Template.aliasExists,
// Mastra's template check) over sandloop's templates:
//
//	GET  /templates/aliases/{alias}                     200 {templateID, public} or 404 {code, message}
//	POST /v3/templates                                  202 {templateID, buildID, names, aliases, tags, public}
//	POST /v2/templates/{templateID}/builds/{buildID}    202: the build starts (400 for what sandloop cannot build)
//	GET  /templates/{templateID}/builds/{buildID}/status 200 {buildID, templateID, status, logEntries, logs, reason?}
//
// (DELETE /templates/{id}, Sandbox.deleteSnapshot, is snapshots.go's.)
//
// A build sandloop can express is one on E2B's base image (or python:3,
// which is the sandbox's own Python 3.11) whose steps are pip installs
// and environment variables: it becomes `sandloop template build NAME
// --pip ... --env ...`. An apt-get install step (aptInstall) passes when
// every package it names is installed in the sandboxes' root already, and
// is refused naming the missing ones otherwise. Anything else (COPY,
// other commands, a start command, other images) is refused at the
// build's start with E2B's error shape, the message saying what sandloop
// supports. A template's
// E2B id is its sandloop name, so Sandbox.create(name) lands in it.

// baseImages are the images a build may start from: E2B's default
// (Template().fromBaseImage()) and Python images that sandloop's own
// Python (Debian's 3.11) stands for.
var baseImages = map[string]bool{"e2bdev/base": true, "e2bdev/base:latest": true, "e2bdev/code-interpreter": true,
	"e2bdev/code-interpreter:latest": true, "python:3": true, "python:3.11": true}

// maxBuilds bounds the builds remembered (finished ones are forgotten
// oldest first).
const maxBuilds = 64

// templateBuild is one E2B build: requested, then started, then ready or
// failed.
type templateBuild struct {
	templateID, buildID, owner string
	created                    time.Time

	mu      sync.Mutex
	started bool
	status  string // waiting, building, ready, error
	logs    []buildLog
	reason  *buildReason
}

type buildLog struct {
	Timestamp string `json:"timestamp"`
	Level     string `json:"level"`
	Message   string `json:"message"`
	Step      string `json:"step,omitempty"`
}

type buildReason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []buildLog `json:"logEntries"`
}

func (b *templateBuild) log(level, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.logs = append(b.logs, buildLog{Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Level: level, Message: msg})
}

// templateRoutes adds the template API to the control plane's mux.
func (h *Handler) templateRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /templates/aliases/{alias}", h.requireKey(h.templateAlias))
	mux.HandleFunc("POST /v3/templates", h.requireKey(h.requestTemplateBuild))
	mux.HandleFunc("POST /v2/templates/{templateID}/builds/{buildID}", h.requireKey(h.startTemplateBuild))
	mux.HandleFunc("GET /templates/{templateID}/builds/{buildID}/status", h.requireKey(h.templateBuildStatus))
	mux.HandleFunc("GET /templates/{templateID}/files/{hash}", h.requireKey(func(w http.ResponseWriter, r *http.Request, _ string) {
		writeControlError(w, http.StatusBadRequest, "sandloop's templates take no files (COPY): "+supportedBuilds)
	}))
}

// supportedBuilds says what an E2B build may be on sandloop.
const supportedBuilds = "sandloop builds templates from pip packages and environment variables only " +
	"(Template().fromBaseImage() or .fromPythonImage('3'), then .pipInstall([...]) and .setEnvs({...})); " +
	"the sandbox's Python is Debian's 3.11 with numpy, pandas and matplotlib; " +
	"an apt-get install step passes when its packages are in the sandbox already; " +
	"other images, other apt-get installs, COPY and other commands cannot be built here (sandloop template build --requirements or --image covers the rest)"

// templateAlias is Template.aliasExists and Mastra's check: 200 for a
// template of that name (or E2B's own names, which every sandloop server
// has), E2B's 404 otherwise, which the SDK turns into false.
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request, _ string) {
	alias := r.PathValue("alias")
	name, _, _ := strings.Cut(alias, ":")
	switch {
	case e2bTemplates[alias] && alias != "":
		writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": true})
	case h.opts.HasTemplate != nil && h.opts.HasTemplate(name):
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": false})
	default:
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found (sandloop template ls lists this server's)", alias))
	}
}

type buildRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"` // deprecated by E2B for name
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

// requestTemplateBuild is POST /v3/templates: a build is registered under
// the template's name; the SDK starts it next.
func (h *Handler) requestTemplateBuild(w http.ResponseWriter, r *http.Request, owner string) {
	if h.opts.BuildTemplate == nil {
		writeControlError(w, http.StatusNotImplemented, "this server builds no templates (sandloop serve with --templates-dir or --data-dir does)")
		return
	}
	var req buildRequest
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	full := req.Name
	if full == "" {
		full = req.Alias
	}
	name, _, _ := strings.Cut(full, ":") // a tag names a build of the same template
	if err := template.ValidName(name); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	if e2bTemplates[name] {
		writeControlError(w, http.StatusBadRequest, fmt.Sprintf("'%s' is E2B's own template's name: give the template another", name))
		return
	}
	b := &templateBuild{templateID: name, buildID: newUUID(), owner: owner, created: time.Now(), status: "waiting"}
	h.mu.Lock()
	if h.builds == nil {
		h.builds = map[string]*templateBuild{}
	}
	h.forgetBuildsLocked()
	h.builds[b.buildID] = b
	h.mu.Unlock()
	tags := append([]string{}, req.Tags...)
	if _, tag, ok := strings.Cut(full, ":"); ok {
		tags = append(tags, tag)
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": name, "buildID": b.buildID, "names": []string{name}, "aliases": []string{name},
		"tags": tags, "public": false})
}

// forgetBuildsLocked drops the oldest finished builds beyond maxBuilds.
func (h *Handler) forgetBuildsLocked() {
	if len(h.builds) < maxBuilds {
		return
	}
	var done []*templateBuild
	for _, b := range h.builds {
		b.mu.Lock()
		if b.status == "ready" || b.status == "error" || !b.started {
			done = append(done, b)
		}
		b.mu.Unlock()
	}
	sort.Slice(done, func(i, j int) bool { return done[i].created.Before(done[j].created) })
	for _, b := range done[:max(0, min(len(done), len(h.builds)-maxBuilds+1))] {
		delete(h.builds, b.buildID)
	}
}

// build finds the owner's build named by the path.
func (h *Handler) build(r *http.Request, owner string) *templateBuild {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.builds[r.PathValue("buildID")]
	if b == nil || b.owner != owner || b.templateID != r.PathValue("templateID") {
		return nil
	}
	return b
}

type buildStep struct {
	Type  string   `json:"type"`
	Args  []string `json:"args"`
	Force bool     `json:"force"`
}

type buildStart struct {
	FromImage         string         `json:"fromImage"`
	FromTemplate      string         `json:"fromTemplate"`
	FromImageRegistry map[string]any `json:"fromImageRegistry"`
	StartCmd          string         `json:"startCmd"`
	ReadyCmd          string         `json:"readyCmd"`
	Steps             []buildStep    `json:"steps"`
	Force             bool           `json:"force"`
}

// startTemplateBuild is POST /v2/templates/{templateID}/builds/{buildID}:
// the steps become a template.Spec (or a 400 saying what sandloop
// builds), and the build runs in the background.
func (h *Handler) startTemplateBuild(w http.ResponseWriter, r *http.Request, owner string) {
	b := h.build(r, owner)
	if b == nil {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("build %s of template '%s' not found", r.PathValue("buildID"), r.PathValue("templateID")))
		return
	}
	var req buildStart
	if err := readJSON(r, &req); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	spec, err := buildSpec(&req, hostDpkgStatus)
	if err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	b.mu.Lock()
	if b.started {
		b.mu.Unlock()
		writeControlError(w, http.StatusConflict, "this build has started already")
		return
	}
	b.started, b.status = true, "building"
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		cancel()
		writeControlError(w, http.StatusServiceUnavailable, "the server is shutting down")
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	b.log("info", fmt.Sprintf("building template %s in a sandbox: pip install %s", b.templateID, strings.Join(spec.Pip, " ")))
	go func() {
		defer h.wg.Done()
		defer cancel()
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-h.stop: // Close: the build's sandbox is killed
				cancel()
			case <-done:
			}
		}()
		t, err := h.opts.BuildTemplate(ctx, b.templateID, spec)
		b.mu.Lock()
		defer b.mu.Unlock()
		now := time.Now().UTC().Format(time.RFC3339Nano)
		if err != nil {
			msg := err.Error()
			var be *template.BuildError
			if !errors.As(err, &be) && !errors.As(err, new(*template.ArgumentError)) && !errors.As(err, new(*template.InUseError)) {
				h.log.Warn("e2b: template build failed", "template", b.templateID, "err", err)
				msg = "the template could not be built: " + msg
			}
			entry := buildLog{Timestamp: now, Level: "error", Message: msg}
			b.logs = append(b.logs, entry)
			b.status, b.reason = "error", &buildReason{Message: msg, LogEntries: []buildLog{entry}}
			return
		}
		b.logs = append(b.logs, buildLog{Timestamp: now, Level: "info",
			Message: fmt.Sprintf("template %s ready: Python %s, %d packages, %d files", t.Name, t.Python, len(t.Packages), t.Files)})
		b.status = "ready"
		h.log.Info("e2b: template built", "template", t.Name, "id", t.ID)
	}()
	w.WriteHeader(http.StatusAccepted)
}

// hostDpkgStatus is dpkg's record of the Debian packages of the root the
// sandboxes of an E2B build run on: the host's /usr (a build starts from
// E2B's base image or python:3, which sandloop's own root stands for).
const hostDpkgStatus = "/var/lib/dpkg/status"

// buildSpec maps an E2B build onto a sandloop template build, or says why
// it cannot. An apt-get install step (aptInstall) is accepted when every
// package it names is installed already in the sandboxes' root, whose
// dpkg status file is dpkgStatus: sandloop installs no Debian packages.
func buildSpec(req *buildStart, dpkgStatus string) (template.Spec, error) {
	spec := template.Spec{Env: map[string]string{}}
	refuse := func(what string) (template.Spec, error) {
		return template.Spec{}, fmt.Errorf("%s cannot be built by sandloop: %s", what, supportedBuilds)
	}
	switch {
	case req.FromTemplate != "" && !e2bTemplates[req.FromTemplate]:
		return refuse(fmt.Sprintf("a template from template '%s'", req.FromTemplate))
	case req.FromTemplate == "" && !baseImages[req.FromImage]:
		return refuse(fmt.Sprintf("a template from the image '%s'", req.FromImage))
	case req.FromImageRegistry != nil:
		return refuse("a template from a private registry")
	case req.StartCmd != "" || req.ReadyCmd != "":
		return refuse("a start or ready command")
	}
	apt := false // an apt-get install step, of packages there already
	for i, st := range req.Steps {
		switch st.Type {
		case "ENV":
			if len(st.Args)%2 != 0 {
				return template.Spec{}, fmt.Errorf("step %d: ENV needs name and value pairs", i+1)
			}
			for j := 0; j < len(st.Args); j += 2 {
				spec.Env[st.Args[j]] = st.Args[j+1]
			}
		case "USER", "WORKDIR":
			// The sandbox has one user and its workdir is the session's
			// workspace (/home/user is the same place).
		case "RUN":
			if len(st.Args) == 0 {
				return template.Spec{}, fmt.Errorf("step %d: RUN without a command", i+1)
			}
			if debs, ok := aptInstallArgs(st.Args[0]); ok {
				if err := aptInstalled(i+1, debs, dpkgStatus); err != nil {
					return template.Spec{}, err
				}
				apt = true
				continue
			}
			pkgs, ok := pipInstallArgs(st.Args[0])
			if !ok {
				return refuse(fmt.Sprintf("step %d, RUN %q,", i+1, st.Args[0]))
			}
			spec.Pip = append(spec.Pip, pkgs...)
		default:
			return refuse(fmt.Sprintf("step %d (%s)", i+1, st.Type))
		}
	}
	if len(spec.Pip) == 0 {
		if !apt {
			return template.Spec{}, fmt.Errorf("nothing to install: %s", supportedBuilds)
		}
		// The Debian packages named are in the sandbox already: the
		// template is the sandbox's own environment under its name.
		spec.AsIs = true
	}
	return spec, nil
}

// pipInstallArgs reads the packages of `pip install A B` (pip3, python -m
// pip, python3 -m pip; the options that change nothing in a sandloop
// template are skipped), or says it is another command.
func pipInstallArgs(cmd string) ([]string, bool) {
	f := strings.Fields(cmd)
	switch {
	case len(f) >= 2 && (f[0] == "pip" || f[0] == "pip3") && f[1] == "install":
		f = f[2:]
	case len(f) >= 4 && (f[0] == "python" || f[0] == "python3") && f[1] == "-m" && f[2] == "pip" && f[3] == "install":
		f = f[4:]
	default:
		return nil, false
	}
	var pkgs []string
	for _, a := range f {
		switch {
		case a == "--user" || a == "--no-cache-dir" || a == "-q" || a == "--quiet" || a == "-U" || a == "--upgrade":
		case strings.HasPrefix(a, "-") || a == "." || strings.ContainsAny(a, "/;&|`$()<>"):
			return nil, false // options, paths and shell are not package names
		default:
			pkgs = append(pkgs, strings.Trim(a, `'"`))
		}
	}
	return pkgs, len(pkgs) > 0
}

// aptInstallArgs reads the Debian packages of E2B's aptInstall step,
// `apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y A
// B` (apt for apt-get, sudo, the update optional, -y, -q,
// --no-install-recommends and --fix-missing allowed), or says it is
// another command.
func aptInstallArgs(cmd string) ([]string, bool) {
	var pkgs []string
	for _, part := range strings.Split(cmd, "&&") {
		f := strings.Fields(part)
		if len(f) > 0 && f[0] == "sudo" {
			f = f[1:]
		}
		for len(f) > 0 && envAssignment.MatchString(f[0]) {
			f = f[1:]
		}
		if len(f) < 2 || (f[0] != "apt-get" && f[0] != "apt") {
			return nil, false
		}
		verb, rest := f[1], f[2:]
		var names []string
		for _, a := range rest {
			switch {
			case aptOptions[a]:
			case debName.MatchString(a) && verb == "install":
				names = append(names, a)
			default:
				return nil, false // other options, versions, files and shell
			}
		}
		switch {
		case verb == "update" && len(names) == 0:
		case verb == "install" && len(names) > 0:
			pkgs = append(pkgs, names...)
		default:
			return nil, false
		}
	}
	return pkgs, len(pkgs) > 0
}

var (
	// envAssignment is NAME=value before a command.
	envAssignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=\S*$`)
	// debName is a Debian package's name.
	debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	// aptOptions change nothing in what ends up installed.
	aptOptions = map[string]bool{"-y": true, "--yes": true, "--assume-yes": true, "-q": true, "-qq": true, "--quiet": true,
		"--no-install-recommends": true, "--fix-missing": true}
)

// aptInstalled says nil when every package of step's apt-get install is
// installed in the root whose dpkg status file is dpkgStatus (by name,
// or by a package that provides it), and otherwise which are not.
func aptInstalled(step int, pkgs []string, dpkgStatus string) error {
	have, err := installedDebs(dpkgStatus)
	if err != nil {
		return fmt.Errorf("step %d, apt-get install %s: the sandboxes' Debian packages cannot be read (%v); %s", step, strings.Join(pkgs, " "), err, noApt)
	}
	var missing []string
	for _, p := range pkgs {
		if !have[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	verb := "is"
	if len(missing) > 1 {
		verb = "are"
	}
	return fmt.Errorf("step %d, apt-get install %s: %s %s not installed in sandloop's sandboxes, and %s",
		step, strings.Join(pkgs, " "), strings.Join(missing, ", "), verb, noApt)
}

// noApt says what to do instead of an apt-get install.
const noApt = "sandloop cannot install Debian packages into a template: build an image template that has them " +
	"(sandloop template build NAME --image REF) and create the sandbox from it"

// installedDebs reads a dpkg status file: the packages installed, and
// the names they provide.
func installedDebs(path string) (map[string]bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, stanza := range strings.Split(string(data), "\n\n") {
		var name, status string
		var provides []string
		for _, line := range strings.Split(stanza, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || strings.HasPrefix(line, " ") {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "Package":
				name = v
			case "Status":
				status = v
			case "Provides":
				for _, p := range strings.Split(v, ",") {
					if f := strings.Fields(p); len(f) > 0 {
						provides = append(provides, f[0])
					}
				}
			}
		}
		if name == "" || !strings.HasSuffix(status, " installed") {
			continue
		}
		have[name] = true
		for _, p := range provides {
			have[p] = true
		}
	}
	return have, nil
}

// templateBuildStatus is the SDK's poll: the log entries from logsOffset,
// and the reason of a failed build.
func (h *Handler) templateBuildStatus(w http.ResponseWriter, r *http.Request, owner string) {
	b := h.build(r, owner)
	if b == nil {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("build %s of template '%s' not found", r.PathValue("buildID"), r.PathValue("templateID")))
		return
	}
	offset, _ := strconv.Atoi(r.URL.Query().Get("logsOffset"))
	b.mu.Lock()
	defer b.mu.Unlock()
	entries := []buildLog{}
	if offset >= 0 && offset < len(b.logs) {
		entries = append(entries, b.logs[offset:]...)
	}
	out := map[string]any{"buildID": b.buildID, "templateID": b.templateID, "status": b.status, "logEntries": entries, "logs": []string{}}
	if b.reason != nil {
		out["reason"] = b.reason
	}
	writeJSON(w, http.StatusOK, out)
}

// newUUID is a random version-4 UUID (E2B's build ids are UUIDs).
func newUUID() string {
	x := randomHex(16)
	return x[0:8] + "-" + x[8:12] + "-4" + x[13:16] + "-a" + x[17:20] + "-" + x[20:32]
}
