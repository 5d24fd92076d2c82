package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// validMounts checks Config.Mounts: each a directory on the host, placed
// under MountsDir, where it covers none of the jail's own files and no
// other mount.
func validMounts(cfg *Config) error {
	seen := map[string]bool{}
	roots := 0
	for _, m := range cfg.Mounts {
		p := m.Path
		if m.Root {
			if roots++; roots > 1 || p != "/" || m.Writable {
				return fmt.Errorf("a root mount (%s) must be one, at \"/\", read-only", m.Host)
			}
			fi, err := os.Stat(m.Host)
			if err != nil {
				return err
			}
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a directory", m.Host)
			}
			continue
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || !strings.HasPrefix(p, MountsDir+"/") {
			return fmt.Errorf("%q: must be an absolute, clean path under %s", p, MountsDir)
		}
		for _, own := range []string{ZygoteWorkspacesDir, ToolsDir} {
			if strings.HasPrefix(p+"/", own+"/") || strings.HasPrefix(own, p+"/") {
				return fmt.Errorf("%s overlaps %s", p, own)
			}
		}
		for q := range seen {
			if strings.HasPrefix(p+"/", q+"/") || strings.HasPrefix(q+"/", p+"/") {
				return fmt.Errorf("%s overlaps %s", p, q)
			}
		}
		seen[p] = true
		for _, f := range cfg.Files {
			if strings.HasPrefix(f.Path, p+"/") || strings.HasPrefix(p+"/", f.Path+"/") {
				return fmt.Errorf("%s overlaps the file %s", p, f.Path)
			}
		}
		fi, err := os.Stat(m.Host)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", m.Host)
		}
	}
	return nil
}

// openMounts clones each mount's directory (as root: the jail's user may
// not traverse its parents; a clone cannot be redirected by a path swapped
// later) and records in cfg where the init finds it: descriptor first,
// first and on. Where open_tree is refused (no root), the init binds the
// path instead.
func openMounts(ms []Mount, first int, cfg *initConfig) ([]*os.File, error) {
	var files []*os.File
	for _, m := range ms {
		host, err := filepath.EvalSymlinks(m.Host)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, &ArgumentError{"mount", err}
		}
		im := initMount{Host: host, Path: m.Path, Writable: m.Writable, Root: m.Root}
		if fd, err := unix.OpenTree(unix.AT_FDCWD, host, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC); err == nil {
			im.FD = first + len(files)
			files = append(files, os.NewFile(uintptr(fd), "mount"))
		}
		cfg.Mounts = append(cfg.Mounts, im)
	}
	return files, nil
}

// mountExtra attaches Config.Mounts: read-only unless writable, nosuid
// and nodev always, so nothing in them gains privileges or reaches a
// device, whatever their files say.
func mountExtra(cfg *initConfig) error {
	for _, m := range cfg.Mounts {
		if m.Root {
			continue // attached by attachImageRoot
		}
		dst := newRoot + m.Path
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if m.FD != 0 {
			err := unix.MoveMount(m.FD, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
			unix.Close(m.FD)
			if err != nil {
				return fmt.Errorf("attach %s: %w", m.Path, err)
			}
		} else if err := mount(oldRoot+m.Host, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dst, &st); err != nil {
			return fmt.Errorf("statfs %s: %w", dst, err)
		}
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
		if !m.Writable {
			flags |= unix.MS_RDONLY
		}
		if err := mount("", dst, "", flags|lockedFlags(st.Flags), ""); err != nil {
			return err
		}
		if !m.Writable {
			// A read-only bind whose flags did not take would be a
			// writable environment shared by every session.
			if err := unix.Statfs(dst, &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
				return errors.New("mount " + m.Path + " read-only: not read-only")
			}
		}
	}
	return nil
}
