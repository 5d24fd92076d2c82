package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/sandloop/sandloop/internal/gateway/restoretest"
	"github.com/sandloop/sandloop/internal/server"
)

// TestRestoreRedirectMatchesOpenAPI: the gateway's 307 to a restored
// session (the one that restores, with the session and Sandloop-Restored,
// and a later one of the same id, without) is what openapi.yaml says, on
// a POST with a body and on a GET.
func TestRestoreRedirectMatchesOpenAPI(t *testing.T) {
	cell := restoretest.New(t, nil)
	cell.Lose(t)
	doc, err := openapi3.NewLoader().LoadFromData(server.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	check := func(method, path, body string) http.Header {
		t.Helper()
		req, _ := http.NewRequest(method, cell.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+cell.Token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := noFollow.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect {
			t.Fatalf("%s %s: %d %s, want 307", method, path, resp.StatusCode, b)
		}
		vreq, _ := http.NewRequest(method, cell.URL+path, strings.NewReader(body))
		vreq.Header = req.Header
		route, params, err := router.FindRoute(vreq)
		if err != nil {
			t.Fatalf("%s %s: not in openapi.yaml: %v", method, path, err)
		}
		in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			t.Errorf("%s %s: the request does not match openapi.yaml: %v", method, path, err)
		}
		// kin-openapi never validates a 307's response: by hand.
		r := route.Operation.Responses.Status(http.StatusTemporaryRedirect)
		if r == nil || r.Value == nil {
			t.Fatalf("%s %s: openapi.yaml documents no 307", method, path)
		}
		for _, h := range []string{"Location", "Sandloop-Restored-From", "Sandloop-Session-Id", "Sandloop-Restored"} {
			if _, ok := r.Value.Headers[h]; !ok {
				t.Errorf("%s %s: the 307 of openapi.yaml does not document the header %s", method, path, h)
			}
		}
		mt := r.Value.Content.Get("application/json")
		var v any
		if mt == nil || mt.Schema == nil {
			t.Errorf("%s %s: the 307 of openapi.yaml has no JSON schema", method, path)
		} else if err := json.Unmarshal(b, &v); err != nil {
			t.Errorf("%s %s → 307 %.300s: not JSON: %v", method, path, b, err)
		} else if err := mt.Schema.Value.VisitJSON(v); err != nil {
			t.Errorf("%s %s → 307 %.300s\ndoes not match openapi.yaml: %v", method, path, b, err)
		}
		if !bytes.Contains(b, []byte(`"restored_from"`)) {
			t.Errorf("%s %s → 307 body %.300s: no restored_from", method, path, b)
		}
		return resp.Header
	}
	first := check("POST", "/v1/sessions/"+cell.Session+"/execute", `{"code": "answer"}`)
	newID := first.Get("Sandloop-Session-Id")
	if first.Get("Location") != "/v1/sessions/"+newID+"/execute" || first.Get("Sandloop-Restored-From") != cell.Session ||
		!strings.Contains(first.Get("Sandloop-Restored"), "files exact") {
		t.Errorf("the restoring 307's headers: %v", first)
	}
	later := check("GET", "/v1/sessions/"+cell.Session+"/files?path=", "")
	if later.Get("Sandloop-Session-Id") != newID || later.Get("Location") != "/v1/sessions/"+newID+"/files?path=" {
		t.Errorf("a later 307 of the same id: %v, want to %s", later, newID)
	}
}
