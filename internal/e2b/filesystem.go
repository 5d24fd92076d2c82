package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/session"
	"github.com/sandloop/sandloop/internal/workspace"
)

// The filesystem.Filesystem messages served (envd's filesystem.proto).

type fileType string

const (
	fileTypeFile      fileType = "FILE_TYPE_FILE"
	fileTypeDirectory fileType = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   fileType = "FILE_TYPE_SYMLINK"
)

type entryInfo struct {
	Name         string    `json:"name"`
	Type         fileType  `json:"type"`
	Path         string    `json:"path"`
	Size         int64     `json:"size,string"`
	Mode         uint32    `json:"mode"`
	Permissions  string    `json:"permissions"`
	Owner        string    `json:"owner"`
	Group        string    `json:"group"`
	ModifiedTime time.Time `json:"modifiedTime"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type entryResponse struct {
	Entry *entryInfo `json:"entry"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type empty struct{}

// sandboxUser is the owner shown for files: E2B's SDKs call theirs "user".
const sandboxUser = "user"

func toEntryInfo(a area, e workspace.Entry) entryInfo {
	t := fileTypeFile
	switch e.Type {
	case "dir":
		t = fileTypeDirectory
	case "symlink":
		t = fileTypeSymlink
	}
	return entryInfo{
		Name: e.Name, Type: t, Path: a.abs(e.Path), Size: e.Size,
		Mode: uint32(e.FileMode.Perm()), Permissions: e.FileMode.String(),
		Owner: sandboxUser, Group: sandboxUser, ModifiedTime: e.ModTime.UTC(),
	}
}

// rpcError maps a file error to a Connect error: its code is what the SDKs
// branch on (not_found: exists() is false; already_exists: makeDir() is false).
func rpcError(err error) error {
	var le *workspace.LimitError
	var pe *workspace.PathError
	switch {
	case errors.Is(err, workspace.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, errOutside):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.As(err, &le):
		return connect.NewError(connect.CodeResourceExhausted, err)
	case errors.Is(err, session.ErrClosed):
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox was killed"))
	case errors.Is(err, session.ErrTmpUnreachable):
		return connect.NewError(connect.CodeUnimplemented, err)
	case errors.As(err, &pe):
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

// withFiles runs fn on the area of the request's sandbox that paths are
// in (all in one: a move between the workspace and /tmp is refused),
// giving fn their forms relative to it (each checked with locate).
func withFiles[T any](h *Handler, ctx context.Context, paths []string, fn func(ws *workspace.Workspace, a area, rel []string) (*T, error)) (*T, error) {
	rel := make([]string, len(paths))
	var a area
	for i, p := range paths {
		pa, r, err := locate(p)
		if err != nil {
			return nil, rpcError(err)
		}
		if i > 0 && pa != a {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s and %s: a move between %s and %s is not served; copy the file instead", paths[0], p, homeDir, tmpDir))
		}
		a, rel[i] = pa, r
	}
	ws, err := h.filesIn(sandboxOf(ctx), a)
	if err != nil {
		return nil, rpcError(err)
	}
	defer ws.Close()
	out, err := fn(ws, a, rel)
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, rpcError(err)
	}
	return out, nil
}

// entryAt describes path rel of area a.
func entryAt(ws *workspace.Workspace, a area, rel string) (*entryResponse, error) {
	e, err := ws.Stat(rel)
	if err != nil {
		return nil, err
	}
	info := toEntryInfo(a, e)
	return &entryResponse{Entry: &info}, nil
}

func unary[Req, Res any](path string, fn func(context.Context, *Req) (*Res, error)) rpcHandler {
	return rpcHandler{path, connect.NewUnaryHandler(path, func(ctx context.Context, r *connect.Request[Req]) (*connect.Response[Res], error) {
		res, err := fn(ctx, r.Msg)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(res), nil
	}, connectOptions...)}
}

func (h *Handler) filesystemHandlers() []rpcHandler {
	return []rpcHandler{
		unary("/filesystem.Filesystem/Stat", h.stat),
		unary("/filesystem.Filesystem/MakeDir", h.makeDir),
		unary("/filesystem.Filesystem/Move", h.move),
		unary("/filesystem.Filesystem/ListDir", h.listDir),
		unary("/filesystem.Filesystem/Remove", h.remove),
		// watch.go
		{"/filesystem.Filesystem/WatchDir", connect.NewServerStreamHandler("/filesystem.Filesystem/WatchDir", h.watchDirStream, connectOptions...)},
		unary("/filesystem.Filesystem/CreateWatcher", h.createWatcher),
		unary("/filesystem.Filesystem/GetWatcherEvents", h.getWatcherEvents),
		unary("/filesystem.Filesystem/RemoveWatcher", h.removeWatcher),
	}
}

func (h *Handler) stat(ctx context.Context, req *pathRequest) (*entryResponse, error) {
	return withFiles(h, ctx, []string{req.Path}, func(ws *workspace.Workspace, a area, rel []string) (*entryResponse, error) {
		return entryAt(ws, a, rel[0])
	})
}

func (h *Handler) makeDir(ctx context.Context, req *pathRequest) (*entryResponse, error) {
	return withFiles(h, ctx, []string{req.Path}, func(ws *workspace.Workspace, a area, rel []string) (*entryResponse, error) {
		if e, err := ws.Stat(rel[0]); err == nil {
			if e.Type == "dir" {
				return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", req.Path))
			}
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s exists and is not a directory", req.Path))
		}
		if err := ws.Mkdir(rel[0]); err != nil {
			return nil, err
		}
		return entryAt(ws, a, rel[0])
	})
}

func (h *Handler) move(ctx context.Context, req *moveRequest) (*entryResponse, error) {
	return withFiles(h, ctx, []string{req.Source, req.Destination}, func(ws *workspace.Workspace, a area, rel []string) (*entryResponse, error) {
		if err := ws.Rename(rel[0], rel[1]); err != nil {
			return nil, err
		}
		return entryAt(ws, a, rel[1])
	})
}

func (h *Handler) listDir(ctx context.Context, req *listDirRequest) (*listDirResponse, error) {
	depth := max(int(req.Depth), 1)
	return withFiles(h, ctx, []string{req.Path}, func(ws *workspace.Workspace, a area, rel []string) (*listDirResponse, error) {
		out := &listDirResponse{Entries: []entryInfo{}}
		e, err := ws.Stat(rel[0])
		if err != nil {
			return nil, err
		}
		if e.Type != "dir" {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", req.Path))
		}
		var walk func(dir string, level int) error
		walk = func(dir string, level int) error {
			list, err := ws.List(dir)
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, workspace.ErrNotFound) {
					return nil // removed meanwhile
				}
				return err
			}
			for _, e := range list {
				out.Entries = append(out.Entries, toEntryInfo(a, e))
				if e.Type == "dir" && level < depth {
					if err := walk(e.Path, level+1); err != nil {
						return err
					}
				}
			}
			return nil
		}
		return out, walk(rel[0], 1)
	})
}

func (h *Handler) remove(ctx context.Context, req *pathRequest) (*empty, error) {
	return withFiles(h, ctx, []string{req.Path}, func(ws *workspace.Workspace, a area, rel []string) (*empty, error) {
		if rel[0] == "." {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("refusing to remove %s itself", a.abs(".")))
		}
		return &empty{}, ws.Remove(rel[0])
	})
}
