package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/sandloop/sandloop/internal/llm/llmtest"
	"github.com/sandloop/sandloop/internal/mcpserver"
	"github.com/sandloop/sandloop/internal/runs/runstest"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/store"
	"github.com/sandloop/sandloop/internal/testutil"
)

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		t.Fatalf("openapi.yaml does not load: %v", err)
	}
	return doc
}

// openapi.yaml is valid OpenAPI 3 and complete: every operation has an
// operationId (unique) and documents its error responses; every answer with
// a body its media type and schema; every request body its limit, the flag
// that sets it and its 413; /mcp is described; and the spec's public
// operations and ?token= operations are exactly the server's.
func TestOpenAPISpecLints(t *testing.T) {
	doc := loadSpec(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not valid OpenAPI: %v", err)
	}
	ids := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			if op.OperationID == "" {
				t.Errorf("%s has no operationId", where)
			} else if other, dup := ids[op.OperationID]; dup {
				t.Errorf("%s and %s share operationId %s", where, other, op.OperationID)
			}
			ids[op.OperationID] = where
			if strings.Contains(path, "{") && op.Responses.Value("404") == nil {
				t.Errorf("%s takes an id or path but documents no 404", where)
			}
			// Every answer with a body says what the body is.
			for code, r := range op.Responses.Map() {
				if !strings.HasPrefix(code, "2") || code == "202" || code == "204" {
					continue
				}
				if len(r.Value.Content) == 0 {
					t.Errorf("%s %s has no content (media type and schema)", where, code)
				}
				for mt, c := range r.Value.Content {
					if c.Schema == nil {
						t.Errorf("%s %s %s has no schema", where, code, mt)
					}
				}
			}
			// Every body is capped, says by how much and by which flag, and
			// documents the 413 of a larger one.
			if op.RequestBody != nil {
				lim, _ := op.RequestBody.Value.Extensions["x-max-bytes"].(map[string]any)
				def, _ := lim["default"].(float64)
				flag, hasFlag := lim["flag"].(string)
				if def <= 0 {
					t.Errorf("%s: its request body has no x-max-bytes default", where)
				} else if want, known := bodyFlags[flag]; hasFlag && (!known || int64(def) != want) {
					t.Errorf("%s: x-max-bytes says %s defaults to %.0f; the server's default is %d", where, flag, def, want)
				}
				if op.Responses.Value("413") == nil {
					t.Errorf("%s takes a body but documents no 413", where)
				}
			}
		}
	}
	mcp := doc.Paths.Value("/mcp")
	if mcp == nil || mcp.Post == nil || mcp.Get == nil || mcp.Delete == nil {
		t.Error("/mcp (POST, GET, DELETE) is not described")
	}
	// The spec says where ?token= works and what needs no token; the
	// server does exactly that.
	srv, err := New(&Options{Manager: session.NewManager(&session.ManagerOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range srv.routes() {
		path := strings.ReplaceAll(rt.pattern, "{path...}", "{path}")
		op := doc.Paths.Find(path).GetOperation(rt.method)
		if op == nil {
			continue // TestOpenAPIMatchesRoutes reports it
		}
		if specTakesQueryToken(doc, path, rt.method) != slices.Contains(QueryTokenRoutes, rt.method+" "+rt.pattern) {
			t.Errorf("%s %s: the spec's token query parameter disagrees with QueryTokenRoutes", rt.method, path)
		}
		if isPublic := op.Security != nil && len(*op.Security) == 0; isPublic != rt.public {
			t.Errorf("%s %s: security: [] in the spec is %v, the server's route is public: %v", rt.method, path, isPublic, rt.public)
		}
	}
}

// bodyFlags are serve's flags that cap request bodies, and their defaults.
var bodyFlags = map[string]int64{
	"--max-body":     DefaultMaxBodyBytes,
	"--max-upload":   DefaultMaxFileBytes,
	"--max-run-body": DefaultMaxRunBodyBytes,
}

// takesQueryToken reports whether the operation lists the token query parameter.
func specTakesQueryToken(doc *openapi3.T, path, method string) bool {
	item := doc.Paths.Find(path)
	op := item.GetOperation(method)
	for _, ps := range []openapi3.Parameters{item.Parameters, op.Parameters} {
		for _, p := range ps {
			if p.Value != nil && p.Value.In == "query" && p.Value.Name == "token" {
				return true
			}
		}
	}
	return false
}

// Real responses of the server match what openapi.yaml says of them.
func TestResponsesMatchOpenAPI(t *testing.T) {
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	id := ts.create(t, "")
	base := "/v1/sessions/" + id
	sc := newSpecCheck(t, ts.URL, "")
	check := func(method, path, body string, hdr ...string) {
		t.Helper()
		sc.do(method, path, body, hdr...)
	}
	check("GET", "/healthz", "")
	check("GET", "/v1/info", "")
	check("GET", "/v1/sessions", "")
	check("GET", base, "")
	check("POST", base+"/execute", `{"code":"print(1)\n6*7"}`)
	check("POST", base+"/execute", `{"code":"1/0"}`)
	check("POST", base+"/execute", `{"code":`)
	// (The router matches {path} within one segment: files at the top.)
	check("PUT", base+"/files/in.csv", "a,b\n", "Content-Type", "application/octet-stream")
	check("GET", base+"/files?path="+url.QueryEscape("/"), "")
	check("GET", base+"/files/in.csv", "")
	check("GET", base+"/files/nothing", "")
	check("DELETE", base+"/files/%2e", "")
	check("DELETE", base+"/files/in.csv", "")
	check("POST", base+"/interrupt", "")
	check("PUT", base+"/notebook", `{"cells":[{"source":"6*7","execution_count":1,"outputs":[{"type":"result","is_main_result":true,"data":{"text/plain":"42"}}]}]}`)
	check("PUT", base+"/notebook", `{"cells":[],"revision":0}`)
	check("GET", base+"/notebook", "")
	check("GET", base+"/notebook.ipynb", "")
	check("PUT", base+"/notebook.ipynb", `{"nbformat":4,"cells":[]}`, "Content-Type", "application/x-ipynb+json")
	check("GET", "/v1/sessions/0000000000000000", "")
	check("DELETE", base, "")
	if checked := sc.checked; checked < 12 {
		t.Errorf("only %d responses checked", checked)
	}
}

// specCheck sends requests to a server and checks each answer against
// openapi.yaml: a status the operation documents, a documented media type,
// and for JSON a body matching the schema.
type specCheck struct {
	t       *testing.T
	doc     *openapi3.T
	router  routers.Router
	url     string
	token   string // sent as Authorization: Bearer, if set
	checked int
}

func newSpecCheck(t *testing.T, url, token string) *specCheck {
	doc := loadSpec(t)
	doc.Servers = nil // match any host: the test server's port is random
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &specCheck{t: t, doc: doc, router: router, url: url, token: token}
}

// answer is a response and its body.
type answer struct {
	*http.Response
	body []byte
	t    *testing.T
}

func (sc *specCheck) do(method, path, body string, hdr ...string) answer {
	t := sc.t
	t.Helper()
	req, _ := http.NewRequest(method, sc.url+path, strings.NewReader(body))
	if sc.token != "" {
		req.Header.Set("Authorization", "Bearer "+sc.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	route, params, err := sc.router.FindRoute(req)
	if err != nil {
		t.Errorf("%s %s: not in openapi.yaml: %v", method, path, err)
		return answer{resp, b, t}
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	jsonBody := mt == "application/json"
	if r := route.Operation.Responses.Status(resp.StatusCode); r != nil && !jsonBody && len(b) > 0 && r.Value.Content.Get(mt) == nil {
		t.Errorf("%s %s → %d %s: openapi.yaml does not document that media type", method, path, resp.StatusCode, mt)
	}
	// Rebuild the request for validation: the client consumed its body.
	vreq, _ := http.NewRequest(method, sc.url+path, strings.NewReader(body))
	vreq.Header = req.Header
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body:    io.NopCloser(bytes.NewReader(b)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: !jsonBody},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s %s → %d %.200s\ndoes not match openapi.yaml: %v", method, path, resp.StatusCode, b, err)
	}
	sc.checked++
	return answer{resp, b, t}
}

// want checks the status and, for an error, its code.
func (a answer) want(status int, code string) {
	a.t.Helper()
	resp, b := a.Response, a.body
	if resp.StatusCode != status {
		a.t.Errorf("%s %s → %d %.300s, want %d %s", resp.Request.Method, resp.Request.URL.RequestURI(), resp.StatusCode, b, status, code)
		return
	}
	if code != "" && !strings.Contains(string(b), `"code":"`+code+`"`) {
		a.t.Errorf("%s %s → %d %s, want the error code %s", resp.Request.Method, resp.Request.URL.RequestURI(), resp.StatusCode, b, code)
	}
}

// operations lists the spec's operations this server serves ("GET /v1/runs").
func (sc *specCheck) operations() map[string]*openapi3.Operation {
	out := map[string]*openapi3.Operation{}
	for path, item := range sc.doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.Extensions["x-gateway-only"] == true {
				continue
			}
			out[method+" "+path] = op
		}
	}
	return out
}

// TestAuthMethodsLimitsMatchOpenAPI checks, on a server with a token, what
// openapi.yaml promises beyond the shapes of answers: which operations need
// the token (/metrics and /mcp too) and which take it as ?token= (only
// downloads and the event stream); 405 with Allow for a wrong method;
// 409 for the artifacts of a running run; 413 over each body limit; and
// the list responses' schemas.
func TestAuthMethodsLimitsMatchOpenAPI(t *testing.T) {
	rs := runstest.New(t, llmtest.Script{
		{ToolCalls: []llmtest.ToolCall{{Name: "execute_python", Arguments: `{"code":"open('out.txt','w').write('hi')"}`}}},
		{ToolCalls: []llmtest.ToolCall{{Name: "finish", Arguments: `{"summary":"wrote out.txt"}`}}},
		{Delay: time.Hour}, // the second run waits for the model until the test ends
	})
	mcpH, err := mcpserver.NewHTTPHandler(mcpserver.SessionSourceFunc(func(context.Context) (mcpserver.Session, error) {
		return nil, errors.New("no tool calls in this test")
	}), &mcpserver.Options{HostChecked: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mcpH.Close() })
	const limit = 64 << 10
	srv, err := New(&Options{Manager: rs.Manager, Runs: rs.Runs, Store: rs.Store, Lessons: rs.Store.(store.LessonStore), Tokens: []string{tokenA},
		Mounts: map[string]http.Handler{"/mcp": mcpH}, MaxBodyBytes: limit, MaxFileBytes: limit, MaxRunBodyBytes: limit})

	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPTest(srv)
	t.Cleanup(hs.Close)
	sc := newSpecCheck(t, hs.URL, tokenA)

	// Lists and runs, with the token.
	a := sc.do("POST", "/v1/sessions", "")
	a.want(201, "")
	var sess struct{ ID string }
	json.Unmarshal(a.body, &sess)
	sc.do("PUT", "/v1/sessions/"+sess.ID+"/files/in.csv", "a,b\n", "Content-Type", "application/octet-stream").want(201, "")
	sc.do("GET", "/v1/sessions", "").want(200, "")
	sc.do("GET", "/v1/sessions/"+sess.ID+"/files", "").want(200, "")
	var done, running store.Run
	a = sc.do("POST", "/v1/runs", `{"task":"write out.txt"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &done)
	testutil.WaitFor(t, time.Minute, func() error {
		if run, err := rs.Store.GetRun(t.Context(), done.ID); err == nil && run.Status == "running" {
			return errors.New("the first run is still running")
		}
		return nil
	})
	a = sc.do("POST", "/v1/runs", `{"task":"wait"}`)
	a.want(201, "")
	json.Unmarshal(a.body, &running)
	sc.do("GET", "/v1/runs", "").want(200, "")
	a = sc.do("GET", "/v1/runs/"+done.ID, "")
	if a.want(200, ""); !strings.Contains(string(a.body), `"status":"done"`) {
		t.Fatalf("the first run did not finish: %s", a.body)
	}
	sc.do("GET", "/v1/runs/"+done.ID+"/artifacts", "").want(200, "")
	// A running run has no final files yet: 409, not an empty zip.
	sc.do("GET", "/v1/runs/"+running.ID+"/artifacts", "").want(409, "run_running")
	sc.do("GET", "/metrics", "").want(200, "")
	a = sc.do("POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		"Accept", "application/json, text/event-stream")
	a.want(200, "")
	sc.do("DELETE", "/mcp", "", "Mcp-Session-Id", a.Header.Get("Mcp-Session-Id")).want(204, "")

	// Over each body limit: 413, as documented.
	sc.do("POST", "/v1/sessions/"+sess.ID+"/execute", `{"code":"`+strings.Repeat("x", limit)+`"}`).want(413, "too_large")
	sc.do("PUT", "/v1/sessions/"+sess.ID+"/files/big.bin", strings.Repeat("x", limit+1), "Content-Type", "application/octet-stream").want(413, "too_large")
	sc.do("POST", "/v1/runs", `{"task":"`+strings.Repeat("x", limit)+`"}`).want(413, "too_large")
	sc.do("POST", "/v1/lessons", `{"text":"`+strings.Repeat("x", limit)+`"}`).want(413, "too_large")
	sc.do("POST", "/v1/sessions", `{"env":{"A":"`+strings.Repeat("x", limit)+`"}}`).want(413, "too_large")

	// Every operation that needs the token refuses a request without one;
	// ?token= opens exactly the operations that list it.
	urlOf := func(path string) string {
		path = strings.ReplaceAll(path, "{path}", "in.csv")
		switch {
		case strings.HasPrefix(path, "/v1/sessions/"):
			return strings.ReplaceAll(path, "{id}", sess.ID)
		case strings.HasPrefix(path, "/v1/runs/"):
			return strings.ReplaceAll(path, "{id}", done.ID)
		}
		return strings.ReplaceAll(path, "{id}", "0000000000000000")
	}
	anon := newSpecCheck(t, hs.URL, "")
	for name, op := range sc.operations() {
		method, path, _ := strings.Cut(name, " ")
		public := op.Security != nil && len(*op.Security) == 0
		a := anon.do(method, urlOf(path), "")
		if public != (a.StatusCode != 401) {
			t.Errorf("%s without a token → %d %.200s (public in openapi.yaml: %v)", name, a.StatusCode, a.body, public)
		}
		if public || path == "/mcp" {
			continue
		}
		a = anon.do(method, urlOf(path)+"?token="+tokenA, "")
		if takes := specTakesQueryToken(sc.doc, path, method); takes != (a.StatusCode != 401) {
			t.Errorf("%s with ?token= → %d %.200s (takes ?token= in openapi.yaml: %v)", name, a.StatusCode, a.body, takes)
		} else if !takes && !strings.Contains(string(a.body), "?token= is accepted only by") {
			t.Errorf("%s with ?token=: %s does not say where it is accepted", name, a.body)
		}
	}

	// A method a path does not take: 405, Allow listing those it does, the JSON error.
	for path, item := range sc.doc.Paths.Map() {
		if path == "/mcp" || item.Get != nil && (item.Get.Extensions["x-gateway-only"] == true || item.Get.Extensions["x-proxy"] == true) {
			continue // the MCP handler answers for itself; the gateway's own route; an app's own methods
		}
		var allow []string
		for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"} {
			if item.GetOperation(m) != nil || m == "HEAD" && item.Get != nil {
				allow = append(allow, m)
			}
		}
		probe := "PATCH" // a method the path does not take
		for _, m := range []string{"PATCH", "PUT", "DELETE", "POST"} {
			if !slices.Contains(allow, m) {
				probe = m
				break
			}
		}
		req, _ := http.NewRequest(probe, hs.URL+urlOf(path), nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e any
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != strings.Join(allow, ", ") || json.Unmarshal(b, &e) != nil {
			t.Errorf("%s %s → %d Allow %q %s; want 405 Allow %q", probe, path, resp.StatusCode, resp.Header.Get("Allow"), b, strings.Join(allow, ", "))
			continue
		}
		if err := sc.doc.Components.Schemas["Error"].Value.VisitJSON(e); err != nil || !strings.Contains(string(b), "method_not_allowed") {
			t.Errorf("%s %s: %s is not the JSON error: %v", probe, path, b, err)
		}
	}
	if sc.checked+anon.checked < 60 {
		t.Errorf("only %d responses checked", sc.checked+anon.checked)
	}
}
