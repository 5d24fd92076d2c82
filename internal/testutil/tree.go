package testutil

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// Tree describes every entry under dir byte for byte, for comparing two
// trees (a workspace before and after a restore): "dir PERM", "link
// TARGET" (never followed), "file PERM SHA256" (with " mtime NS" when
// mtime is set), "other TYPE" for what is neither (never opened: a FIFO
// would block). Keys are paths relative to dir.
func Tree(tb testing.TB, dir string, mtime bool) map[string]string {
	tb.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch m := fi.Mode(); {
		case m.IsDir():
			out[rel] = fmt.Sprintf("dir %v", m.Perm())
		case m&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "link " + l
		case m.IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %v %x", m.Perm(), sha256.Sum256(b))
			if mtime {
				out[rel] += fmt.Sprintf(" mtime %d", fi.ModTime().UnixNano())
			}
		default:
			out[rel] = "other " + m.Type().String()
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
