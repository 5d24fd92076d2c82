package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// File describes a file or directory of a session's workspace.
type File struct {
	// Path is relative to /workspace.
	Path string `json:"path"`
	Name string `json:"name"`
	// Type is "file", "dir", "symlink" or "other".
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
}

// Archive formats.
const (
	FormatTarGz = "tar.gz"
	FormatZip   = "zip"
)

// Upload writes the content of r to path (relative to /workspace) in
// session id, creating parent directories and replacing any file there.
// The server refuses a file or a workspace above its caps with an
// *APIError with StatusCode 413.
func (c *Client) Upload(ctx context.Context, id, path string, r io.Reader) (*File, error) {
	fp, err := filePath(path)
	if err != nil {
		return nil, err
	}
	resp, err := c.request(ctx, http.MethodPut, c.sessionPath(id, "/files/"+fp), nil, r, "application/octet-stream", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var f File
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return nil, fmt.Errorf("sandloop: decode upload response: %w", err)
	}
	return &f, nil
}

// Download copies file path of session id to w and returns the number of
// bytes written.
func (c *Client) Download(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	fp, err := filePath(path)
	if err != nil {
		return 0, err
	}
	resp, err := c.request(ctx, http.MethodGet, c.sessionPath(id, "/files/"+fp), nil, nil, "", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("sandloop: download %s: got %d of %d bytes", path, n, resp.ContentLength)
	}
	return n, err
}

// ReadFile returns the content of file path of session id.
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	var b bytes.Buffer
	if _, err := c.Download(ctx, id, path, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ListFiles lists directory dir ("" for the workspace's root) of session
// id, sorted by name. A file's path lists that file alone.
func (c *Client) ListFiles(ctx context.Context, id, dir string) ([]File, error) {
	var out struct {
		Files []File `json:"files"`
	}
	q := url.Values{}
	if dir != "" {
		q.Set("path", dir)
	}
	if err := c.doJSON(ctx, http.MethodGet, c.sessionPath(id, "/files"), q, nil, &out); err != nil {
		return nil, err
	}
	return out.Files, nil
}

// DeleteFile removes file (or empty directory) path of session id.
func (c *Client) DeleteFile(ctx context.Context, id, path string) error {
	fp, err := filePath(path)
	if err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, c.sessionPath(id, "/files/"+fp), nil, nil, nil)
}

// ArchiveOptions choose what Archive writes. A nil *ArchiveOptions means
// the whole workspace as tar.gz.
type ArchiveOptions struct {
	// Format is FormatTarGz or FormatZip. If empty, FormatTarGz.
	Format string
	// Path limits the archive to a directory of the workspace. If empty,
	// all of it.
	Path string
}

// Archive writes session id's workspace to w as an archive. If the
// server fails once the archive has started, the error is the broken
// transfer (the archive written so far is incomplete).
func (c *Client) Archive(ctx context.Context, id string, w io.Writer, opts *ArchiveOptions) (int64, error) {
	q := url.Values{}
	if opts != nil {
		if opts.Format != "" {
			q.Set("format", opts.Format)
		}
		if opts.Path != "" {
			q.Set("path", opts.Path)
		}
	}
	resp, err := c.request(ctx, http.MethodGet, c.sessionPath(id, "/archive"), q, nil, "", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return io.Copy(w, resp.Body)
}
