package workspace

import (
	"archive/tar"
	"archive/zip"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// Formats of Archive.
const (
	FormatTarGz = "tar.gz"
	FormatZip   = "zip"
)

// Archive writes the workspace (or the directory sub of it) to out as a
// .tar.gz or .zip. Symlinks are stored as links in tar and skipped in zip;
// FIFOs, sockets and devices are skipped; nothing is followed out of the
// workspace.
func (w *Workspace) Archive(ctx context.Context, out io.Writer, format, sub string) error {
	rel, err := Clean(sub)
	if err != nil {
		return err
	}
	var add func(name string, e Entry, r io.Reader, link string) error
	var finish func() error
	switch format {
	case FormatTarGz, "tgz", "":
		gz := gzip.NewWriter(out)
		tw := tar.NewWriter(gz)
		add = func(name string, e Entry, r io.Reader, link string) error {
			h := &tar.Header{Name: name, ModTime: e.ModTime, Mode: 0o644, Uname: "sandbox", Gname: "sandbox", Uid: 1000, Gid: 1000}
			switch e.Type {
			case "dir":
				h.Typeflag, h.Name, h.Mode = tar.TypeDir, name+"/", 0o755
			case "symlink":
				h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, link, 0o777
			default:
				h.Typeflag, h.Size = tar.TypeReg, e.Size
				if strings.Contains(e.Mode, "x") {
					h.Mode = 0o755
				}
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if r != nil {
				_, err := io.CopyN(tw, r, e.Size)
				return err
			}
			return nil
		}
		finish = func() error {
			if err := tw.Close(); err != nil {
				return err
			}
			return gz.Close()
		}
	case FormatZip:
		zw := zip.NewWriter(out)
		add = func(name string, e Entry, r io.Reader, link string) error {
			if e.Type == "symlink" {
				return nil
			}
			h := &zip.FileHeader{Name: name, Method: zip.Deflate, Modified: e.ModTime}
			if e.Type == "dir" {
				h.Name += "/"
				h.SetMode(0o755 | fs.ModeDir)
			} else if strings.Contains(e.Mode, "x") {
				h.SetMode(0o755)
			} else {
				h.SetMode(0o644)
			}
			fw, err := zw.CreateHeader(h)
			if err != nil || r == nil {
				return err
			}
			_, err = io.CopyN(fw, r, e.Size)
			return err
		}
		finish = zw.Close
	default:
		return &ArgumentError{"format", fmt.Errorf("unknown archive format %q (use tar.gz or zip)", format)}
	}
	err = fs.WalkDir(w.root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == rel {
			return nil
		}
		name := strings.TrimPrefix(p, rel+"/")
		if rel == "." {
			name = p
		}
		switch {
		case d.IsDir():
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			return add(name, entryOf(p, fi), nil, "")
		case d.Type()&fs.ModeSymlink != 0:
			link, err := w.root.Readlink(p)
			if err != nil {
				return nil
			}
			fi, _ := d.Info()
			return add(name, entryOf(p, fi), nil, link)
		case d.Type().IsRegular():
			f, e, err := w.Open(p)
			if err != nil {
				return nil // replaced by something else meanwhile
			}
			defer f.Close()
			return add(name, e, f, "")
		}
		return nil
	})
	if err != nil {
		return err
	}
	return finish()
}
