package session

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sandloop/sandloop/internal/workspace"
)

// A template built from a snapshot (package template) seeds each of its
// sessions before the session is handed out: the snapshot's files copied
// from the template's read-only tree into the session's workspace (a
// writable copy: a write in one session reaches neither the template nor
// another session), then its variables imported from one sealed state
// file that every session's kernel maps copy-on-write.

// loadSeed copies u's seed into the session, which New just started
// (no one has it yet).
func (s *Session) loadSeed(ctx context.Context, u *TemplateUse) (*Restored, error) {
	seed := u.Seed
	k, err := s.kernel()
	if err != nil {
		return nil, err
	}
	kc := checkpointsOf(k)
	ws, err := OpenWorkspace(s.workspace, workspace.Options{})
	if err != nil {
		return nil, err
	}
	b, err := ws.Bulk()
	if err != nil {
		ws.Close()
		return nil, err
	}
	n, err := copySeedFiles(ctx, b, seed.Files)
	ws.Close()
	if err != nil {
		return nil, fmt.Errorf("session %s: copy the files of template %s: %w", s.id, u.Name, err)
	}
	// Not the snapshot's id: it is its owner's, the template everyone's.
	res := &Restored{From: "template " + u.Name, Files: n}
	said := map[string]bool{}
	if seed.State != nil {
		imported, err := kc.ImportStateFile(ctx, seed.State)
		if err != nil {
			return nil, s.kernelErr("import the variables of template "+u.Name, err)
		}
		res.Variables, res.ExecutionCount = imported.Variables, imported.ExecutionCount
		for _, ns := range imported.NotSaved {
			said[ns.Name] = true
			res.NotRestored = append(res.NotRestored, ns.Name+": "+ns.Reason)
		}
	}
	for _, ns := range seed.NotSaved {
		name, _, _ := cutReason(ns)
		if !said[name] {
			said[name] = true
			res.NotRestored = append(res.NotRestored, ns)
		}
	}
	s.setRestored(res)
	out := *res
	return &out, nil
}

// cutReason splits "name: reason".
func cutReason(s string) (name, reason string, ok bool) {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == ':' && s[i+1] == ' ' {
			return s[:i], s[i+2:], true
		}
	}
	return s, "", false
}

// copySeedFiles copies the tree at root (a template's, read-only, which
// nothing writes) into b, and returns how many files and links it holds.
// Each file is a copy of its own (a workspace is a tmpfs: no reflink, and
// a hard link would share writes); the bytes move in the kernel
// (os.File's ReadFrom: copy_file_range, else sendfile). Files keep their
// execute bit, writable by the session.
func copySeedFiles(ctx context.Context, b *workspace.Bulk, root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch t := d.Type(); {
		case t.IsDir():
			if err := b.Mkdir(rel); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			n++
			return b.Symlink(target, rel)
		case t.IsRegular():
			f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			fi, err := f.Stat()
			if err == nil {
				_, err = b.Write(rel, f)
			}
			f.Close()
			if err != nil {
				return err
			}
			n++
			if fi.Mode()&0o111 != 0 {
				return b.Chmod(rel, 0o755)
			}
		}
		return nil
	})
	return n, err
}

// CopyTemplateFiles copies the files of u's seed (none without one) into
// the workspace directory dir, for a program that runs without a kernel
// (sandloop run, exec), and returns how many it copied. Its variables are
// a kernel's only.
func CopyTemplateFiles(ctx context.Context, dir string, u *TemplateUse) (int, error) {
	if u == nil || u.Seed == nil {
		return 0, nil
	}
	ws, err := OpenWorkspace(dir, workspace.Options{})
	if err != nil {
		return 0, err
	}
	defer ws.Close()
	b, err := ws.Bulk()
	if err != nil {
		return 0, err
	}
	return copySeedFiles(ctx, b, u.Seed.Files)
}
