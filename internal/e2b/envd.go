package e2b

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/workspace"
)

// workspaceDir is the sandbox's working directory, as kernels and
// commands see it; homeDir is the same directory under E2B's name for it
// (a link in every jail), where E2B's SDKs expect the home.
const (
	workspaceDir = "/workspace"
	homeDir      = jail.HomeDir
	tmpDir       = "/tmp"
)

// errOutside: the files API reaches only the workspace and /tmp.
var errOutside = errors.New("only " + homeDir + " (the sandbox's home and working directory, also " + workspaceDir + ") and " + tmpDir + " are reachable through the files API")

// area is a directory of the sandbox the files API serves.
type area int

const (
	areaHome area = iota // the workspace
	areaTmp              // the sandbox's /tmp
)

// abs is the path kernels and commands see for rel in a.
func (a area) abs(rel string) string {
	if a == areaTmp {
		return path.Join(tmpDir, rel)
	}
	return path.Join(homeDir, rel)
}

// locate maps a path the SDK sent (absolute, or relative to the home) to
// the area it is in and its path there.
func locate(p string) (area, string, error) {
	if !strings.HasPrefix(p, "/") {
		rel, err := workspace.Clean(p)
		return areaHome, rel, err
	}
	c := path.Clean(p)
	for _, d := range []struct {
		dir string
		a   area
	}{{homeDir, areaHome}, {workspaceDir, areaHome}, {tmpDir, areaTmp}} {
		switch {
		case c == d.dir:
			return d.a, ".", nil
		case strings.HasPrefix(c, d.dir+"/"):
			rel, err := workspace.Clean(strings.TrimPrefix(c, d.dir+"/"))
			return d.a, rel, err
		}
	}
	return areaHome, "", &workspace.PathError{Path: p, Err: errOutside}
}

// relPath maps a path the SDK sent to one inside the workspace (a path
// in /tmp is refused, as outside).
func relPath(p string) (string, error) {
	a, rel, err := locate(p)
	if err == nil && a != areaHome {
		err = &workspace.PathError{Path: p, Err: fmt.Errorf("only %s is served here, not %s", homeDir, tmpDir)}
	}
	return rel, err
}

// absPath is the path kernels and commands see for a workspace path.
func absPath(rel string) string { return areaHome.abs(rel) }

// jsonCodec is Connect's JSON codec over encoding/json, for the envd
// message types of this package (written from the envd protos: field
// names in lowerCamelCase, enums by name, int64 as strings, bytes in
// base64). The SDKs speak only JSON to envd.
type jsonCodec struct{ name string }

func (c jsonCodec) Name() string                  { return c.name }
func (c jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }
func (c jsonCodec) Unmarshal(b []byte, v any) error {
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("invalid request: %v", err)
	}
	return nil
}

var connectOptions = []connect.HandlerOption{
	connect.WithCodec(jsonCodec{"json"}),
	connect.WithCodec(jsonCodec{"json; charset=utf-8"}),
}

func (h *Handler) envdRoutes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", h.download)
	mux.HandleFunc("POST /files", h.upload)
	for _, hd := range h.filesystemHandlers() {
		mux.Handle(hd.path, hd.h)
	}
	for _, hd := range h.processHandlers() {
		mux.Handle(hd.path, hd.h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeControlError(w, http.StatusNotFound, fmt.Sprintf("no envd route %s %s on this server", r.Method, r.URL.Path))
	})
	return mux
}

type rpcHandler struct {
	path string
	h    http.Handler
}

// files opens the workspace of the request's sandbox.
func (h *Handler) files(sb *sandbox) (*workspace.Workspace, error) {
	return h.filesIn(sb, areaHome)
}

// filesIn opens area a of the request's sandbox.
func (h *Handler) filesIn(sb *sandbox, a area) (*workspace.Workspace, error) {
	opts := workspace.Options{MaxFileBytes: h.opts.MaxFileBytes, MaxTotalBytes: h.opts.MaxWorkspaceBytes}
	if a == areaTmp {
		return sb.ms.TmpFiles(opts)
	}
	return sb.ms.Files(opts)
}

// restStatus maps a file error to envd's REST status.
func restStatus(err error) int {
	var le *workspace.LimitError
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errOutside):
		return http.StatusForbidden
	case errors.As(err, &le):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, workspace.ErrNotRegular), errors.As(err, new(*workspace.PathError)):
		return http.StatusBadRequest
	case errors.Is(err, session.ErrClosed):
		return http.StatusBadGateway
	case errors.Is(err, session.ErrTmpUnreachable):
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	p := r.URL.Query().Get("path")
	a, rel, err := locate(p)
	if err != nil {
		writeControlError(w, restStatus(err), err.Error())
		return
	}
	ws, err := h.filesIn(sb, a)
	if err != nil {
		writeControlError(w, restStatus(err), err.Error())
		return
	}
	defer ws.Close()
	f, e, err := ws.Open(rel)
	if err != nil {
		writeControlError(w, restStatus(err), err.Error())
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": e.Name}))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, io.LimitReader(f, e.Size))
}

// signed reports whether r carries a valid signature by sb's envd token,
// as E2B's downloadUrl() and uploadUrl() make them: "v1_" and the
// unpadded base64 SHA-256 of path:operation:user:token[:expiration].
func (sb *sandbox) signed(r *http.Request) bool {
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + sb.envdToken
	if exp := q.Get("signature_expiration"); exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > n {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return tokenOK(sig, "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
}

// signer returns the running sandbox whose token signed r, or nil.
func (h *Handler) signer(r *http.Request) *sandbox {
	h.mu.Lock()
	all := make([]*sandbox, 0, len(h.sandboxes))
	for _, sb := range h.sandboxes {
		all = append(all, sb)
	}
	h.mu.Unlock()
	for _, sb := range all {
		if sb.signed(r) {
			return h.lookup(sb.id)
		}
	}
	return nil
}

type uploaded struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload writes one file (application/octet-stream, maybe gzip-encoded)
// or the parts named "file" of a multipart form, streaming each to disk.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r.Context())
	opened := map[area]*workspace.Workspace{}
	defer func() {
		for _, ws := range opened {
			ws.Close()
		}
	}()
	body := io.Reader(r.Body)
	if strings.EqualFold(r.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeControlError(w, http.StatusBadRequest, "Content-Encoding gzip: "+err.Error())
			return
		}
		body = zr
	}
	target := r.URL.Query().Get("path")
	var out []uploaded
	write := func(p string, src io.Reader) error {
		a, rel, err := locate(p)
		if err != nil {
			return err
		}
		ws := opened[a]
		if ws == nil {
			if ws, err = h.filesIn(sb, a); err != nil {
				return err
			}
			opened[a] = ws
		}
		if _, err := ws.Write(rel, src); err != nil {
			return err
		}
		out = append(out, uploaded{Path: a.abs(rel), Name: path.Base(rel), Type: "file"})
		return nil
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeControlError(w, http.StatusBadRequest, "multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := target
			if p == "" {
				// The part's filename is a path: Part.FileName would
				// keep only its last element.
				_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = cd["filename"]
			}
			if p == "" {
				writeControlError(w, http.StatusBadRequest, "a file part needs a filename, or the path query parameter")
				return
			}
			if err := write(p, part); err != nil {
				writeControlError(w, restStatus(err), err.Error())
				return
			}
		}
	} else {
		if target == "" {
			writeControlError(w, http.StatusBadRequest, "an application/octet-stream upload needs the path query parameter")
			return
		}
		if err := write(target, body); err != nil {
			writeControlError(w, restStatus(err), err.Error())
			return
		}
	}
	if out == nil {
		writeControlError(w, http.StatusBadRequest, `no file in the request: send multipart parts named "file" or an application/octet-stream body`)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
