package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/sandloop/sandloop/internal/session"
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
// operationId (unique) and documents its error responses.
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
		}
	}
}

// Real responses of the server match what openapi.yaml says of them.
func TestResponsesMatchOpenAPI(t *testing.T) {
	doc := loadSpec(t)
	doc.Servers = nil // match any host: the test server's port is random
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, session.ManagerOptions{}, Options{})
	id := ts.create(t, "")
	base := "/v1/sessions/" + id
	checked := 0
	check := func(method, path, body string, hdr ...string) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
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
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Errorf("%s %s: not in openapi.yaml: %v", method, path, err)
			return
		}
		// Rebuild the request for validation: the client consumed its body.
		vreq, _ := http.NewRequest(method, ts.URL+path, strings.NewReader(body))
		vreq.Header = req.Header
		in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
		out := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Body: io.NopCloser(bytes.NewReader(b)), Options: &openapi3filter.Options{IncludeResponseStatus: true},
		}
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s %s → %d %.200s\ndoes not match openapi.yaml: %v", method, path, resp.StatusCode, b, err)
		}
		checked++
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
	check("GET", "/v1/sessions/0000000000000000", "")
	check("DELETE", base, "")
	if checked < 12 {
		t.Errorf("only %d responses checked", checked)
	}
}
