package e2b

import (
	"fmt"
	"strings"
)

// e2bTemplates are the names of E2B's own templates, which SDKs send by
// default: their sandboxes are default sessions.
var e2bTemplates = map[string]bool{"": true, "base": true, "code-interpreter-v1": true, "code-interpreter": true}

// sessionTemplate is the sandloop template a create's templateID picks:
// the template of that name where one exists (Options.HasTemplate), none
// for E2B's own names and for ids that cannot be a template's name
// (snapshot ids, team/name:tag), and a not-found error for any other
// name, which E2B's SDKs raise as their own (a SandboxError with
// statusCode 404, as E2B answers for a template it does not have). A
// server without templates takes any templateID, as before.
func (h *Handler) sessionTemplate(id string) (string, error) {
	if h.opts.HasTemplate == nil {
		return "", nil
	}
	if h.opts.HasTemplate(id) {
		return id, nil
	}
	if name, _, ok := strings.Cut(id, ":"); ok && h.opts.HasTemplate(name) {
		return name, nil // name:tag, as Template.build names a build
	}
	if e2bTemplates[id] || strings.ContainsAny(id, ":/") {
		return "", nil
	}
	return "", fmt.Errorf("template '%s' not found (sandloop template ls lists this server's)", id)
}
