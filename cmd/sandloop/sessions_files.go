package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/sandloop/sandloop/client"
	"github.com/spf13/cobra"
)

// The verbs that move files in and out of a server's sessions: files
// (list), put, get and archive. Like run's --out, get never overwrites a
// local file that holds something else unless --force, and says so before
// writing anything.

func sessionFileCmds(f *sessionsFlags) []*cobra.Command {
	filesCmd := &cobra.Command{
		Use: "files ID [DIR]", Short: "List a directory of a session's workspace (its top if no DIR)", Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := ""
			if len(args) == 2 {
				dir = args[1]
			}
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				list, err := c.ListFiles(ctx, args[0], dir)
				if err == nil && !f.json {
					printFiles(cmd.OutOrStdout(), cmd.ErrOrStderr(), list)
				}
				return map[string]any{"files": list}, err
			})
		},
	}
	put := &cobra.Command{
		Use:   "put ID LOCAL [PATH]",
		Short: "Copy a local file or directory into a session's workspace (to PATH, by default its name)",
		Long: `Copy LOCAL, a file or a directory with everything under it, into the session's workspace
at PATH (relative to /workspace; by default LOCAL's name). Parent directories are made, files
there are replaced. LOCAL - reads stdin (PATH is then needed). Symbolic links and special
files are left out, and counted.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, local := args[0], args[1]
			dst := ""
			if len(args) == 3 {
				dst = args[2]
			}
			if local == "-" {
				if dst == "" {
					return usagef("put ID - PATH: stdin needs the PATH to write it to")
				}
				return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
					fi, err := c.Upload(ctx, id, dst, cmd.InOrStdin())
					if err == nil && !f.json {
						fmt.Fprintf(cmd.OutOrStdout(), "put stdin in %s:/workspace/%s (%s)\n", id, fi.Path, sizeText(fi.Size))
					}
					return fi, err
				})
			}
			fi, err := os.Stat(local)
			if err != nil {
				return usagef("cannot read %s: %v", local, unwrapPathError(err))
			}
			if dst == "" {
				abs, _ := filepath.Abs(local)
				dst = filepath.Base(abs)
			}
			if !fi.IsDir() {
				return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
					up, err := uploadFile(ctx, c, id, local, dst)
					if err == nil && !f.json {
						fmt.Fprintf(cmd.OutOrStdout(), "put %s in %s:/workspace/%s (%s)\n", local, id, up.Path, sizeText(up.Size))
					}
					return up, err
				})
			}
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				var sent []*client.File
				var total int64
				skipped := 0
				err := filepath.WalkDir(local, func(p string, d fs.DirEntry, err error) error {
					switch {
					case err != nil:
						return err
					case d.IsDir():
						return nil
					case !d.Type().IsRegular():
						skipped++
						return nil
					}
					rel, _ := filepath.Rel(local, p)
					up, err := uploadFile(ctx, c, id, p, path.Join(dst, filepath.ToSlash(rel)))
					if err != nil {
						return fmt.Errorf("%s: %w", p, err)
					}
					sent = append(sent, up)
					total += up.Size
					return nil
				})
				if err == nil && !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "put %d file(s) (%s) in %s:/workspace/%s\n", len(sent), sizeText(total), id, path.Clean(dst))
					if skipped > 0 {
						fmt.Fprintf(cmd.ErrOrStderr(), "note: %d symbolic link(s) or special file(s) left out\n", skipped)
					}
				}
				return map[string]any{"files": sent}, err
			})
		},
	}
	var force bool
	get := &cobra.Command{
		Use:   "get ID PATH [LOCAL]",
		Short: "Copy a file or directory of a session's workspace here (to LOCAL, by default its name; - for stdout)",
		Long: `Copy PATH (relative to /workspace), a file or a directory with everything under it, from
the session to LOCAL (by default PATH's name, here; a file goes into LOCAL if LOCAL is a
directory, a directory's contents go into LOCAL; - writes a file to stdout). Before
writing anything it checks that no local file holding something else would be
overwritten: those are listed and nothing is written, unless --force. Symbolic links are
left out, and counted.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, src := args[0], args[1]
			local := ""
			if len(args) == 3 {
				local = args[2]
			}
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				list, err := c.ListFiles(ctx, id, src)
				if err != nil {
					return nil, err
				}
				name := path.Base(path.Clean("/" + src)) // "/" for the workspace itself
				if name == "/" {
					name = id
				}
				if len(list) == 1 && list[0].Type != "dir" && path.Clean(list[0].Path) == path.Clean(strings.TrimPrefix(src, "/workspace/")) {
					return getFile(ctx, cmd, c, id, list[0], name, local, force, f.json)
				}
				if local == "-" {
					return nil, usagef("%s is a directory: stdout takes one file (for an archive: sandloop sessions archive %s --path %s -o -)", src, id, src)
				}
				return getDir(ctx, cmd, c, id, src, cmp.Or(local, name), force, f.json)
			})
		},
	}
	get.Flags().BoolVar(&force, "force", false, "overwrite local files that hold something else")
	var out, sub string
	var zipFormat, archiveForce bool
	archive := &cobra.Command{
		Use:   "archive ID",
		Short: "Write a session's workspace (or --path DIR of it) as .tar.gz, or .zip with --zip",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			format := client.FormatTarGz
			if zipFormat {
				format = client.FormatZip
			}
			if out == "" {
				out = id + "." + format
			}
			var w io.Writer = cmd.OutOrStdout()
			if out != "-" {
				if _, err := os.Stat(out); err == nil && !archiveForce {
					return usagef("%s exists: pass --force to overwrite it, or -o another file", out)
				}
				tmp, err := os.CreateTemp(filepath.Dir(out), ".sandloop-archive-*")
				if err != nil {
					return err
				}
				defer os.Remove(tmp.Name())
				defer tmp.Close()
				w = tmp
			}
			return withClient(cmd, f, func(ctx context.Context, c *client.Client) (any, error) {
				n, err := c.Archive(ctx, id, w, &client.ArchiveOptions{Format: format, Path: sub})
				if err != nil || out == "-" {
					return nil, err
				}
				tmp := w.(*os.File)
				if err := tmp.Close(); err != nil {
					return nil, err
				}
				if err := os.Rename(tmp.Name(), out); err != nil {
					return nil, err
				}
				if !f.json {
					fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s)\n", out, sizeText(n))
				}
				return map[string]any{"file": out, "bytes": n}, nil
			})
		},
	}
	archive.Flags().StringVarP(&out, "output", "o", "", "the file to write (- for stdout; default ID.tar.gz or ID.zip)")
	archive.Flags().StringVar(&sub, "path", "", "only this directory of the workspace")
	archive.Flags().BoolVar(&zipFormat, "zip", false, "a .zip instead of a .tar.gz (symbolic links left out)")
	archive.Flags().BoolVar(&archiveForce, "force", false, "overwrite the output file if it exists")
	return []*cobra.Command{filesCmd, put, get, archive}
}

// uploadFile puts local file p at dst in session id.
func uploadFile(ctx context.Context, c *client.Client, id, p, dst string) (*client.File, error) {
	r, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return c.Upload(ctx, id, dst, r)
}

// getFile downloads file fi of session id to local (name if empty, into
// it if it is a directory, stdout if -): into a temporary file first,
// which replaces local only if local holds the same or force.
func getFile(ctx context.Context, cmd *cobra.Command, c *client.Client, id string, fi client.File, name, local string, force, asJSON bool) (any, error) {
	if local == "-" {
		_, err := c.Download(ctx, id, fi.Path, cmd.OutOrStdout())
		return nil, err
	}
	local = cmp.Or(local, name)
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, name)
	}
	if err := os.MkdirAll(filepath.Dir(local), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(local), ".sandloop-get-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	n, err := c.Download(ctx, id, fi.Path, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if same, exists := sameFile(tmp.Name(), local); exists && !same && !force {
		return nil, usagef("%s exists and holds something else: nothing was written; pass --force to overwrite it, or give another LOCAL", local)
	}
	os.Chmod(tmp.Name(), 0o644|executable(fi.Mode))
	if err := os.Rename(tmp.Name(), local); err != nil {
		return nil, err
	}
	if !asJSON {
		fmt.Fprintf(cmd.OutOrStdout(), "got %s:/workspace/%s in %s (%s)\n", id, fi.Path, local, sizeText(n))
	}
	return map[string]any{"file": local, "bytes": n}, nil
}

func executable(mode string) os.FileMode {
	if strings.Contains(mode, "x") {
		return 0o111
	}
	return 0
}

// getDir downloads directory src of session id into local (made if
// missing), from the session's archive of it, kept in a temporary file
// to be read twice: first for the files it would overwrite, then to
// write. Every name is resolved inside local (os.Root): none leads out.
func getDir(ctx context.Context, cmd *cobra.Command, c *client.Client, id, src, local string, force, asJSON bool) (any, error) {
	tmp, err := os.CreateTemp("", "sandloop-get-*.tar.gz")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := c.Archive(ctx, id, tmp, &client.ArchiveOptions{Path: src}); err != nil {
		return nil, err
	}
	var clash []string
	err = eachTarEntry(tmp, func(h *tar.Header, r io.Reader) error {
		if h.Typeflag == tar.TypeReg && !force {
			if same, exists := sameContent(r, filepath.Join(local, filepath.FromSlash(h.Name))); exists && !same {
				clash = append(clash, h.Name)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(clash) > 0 {
		return nil, usagef("%s: the copy would overwrite %s; nothing was written: pass --force to overwrite, or give another LOCAL", local, clashList(clash))
	}
	if err := os.MkdirAll(local, 0o755); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(local)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var n int
	var total int64
	skipped := 0
	err = eachTarEntry(tmp, func(h *tar.Header, r io.Reader) error {
		name := filepath.FromSlash(strings.TrimSuffix(h.Name, "/"))
		switch h.Typeflag {
		case tar.TypeDir:
			return root.MkdirAll(name, 0o755)
		case tar.TypeReg:
			if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644|os.FileMode(h.Mode)&0o111)
			if err != nil {
				return err
			}
			m, err := io.Copy(w, r)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			n++
			total += m
			return err
		default:
			skipped++
			return nil
		}
	})
	if err != nil {
		return nil, err
	}
	if !asJSON {
		fmt.Fprintf(cmd.OutOrStdout(), "got %d file(s) (%s) of %s:/workspace/%s in %s\n", n, sizeText(total), id, strings.TrimPrefix(path.Clean("/"+src), "/"), local)
		if skipped > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: %d symbolic link(s) left out\n", skipped)
		}
	}
	return map[string]any{"directory": local, "files": n, "bytes": total}, nil
}

// eachTarEntry calls fn with each entry of the .tar.gz in f, from its start.
func eachTarEntry(f *os.File, fn func(*tar.Header, io.Reader) error) error {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("the server's archive: %w", err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the server's archive: %w", err)
		}
		if !filepath.IsLocal(filepath.FromSlash(strings.TrimSuffix(h.Name, "/"))) {
			return fmt.Errorf("the server's archive names %q, outside the directory", h.Name)
		}
		if err := fn(h, tr); err != nil {
			return err
		}
	}
}

// sameContent reports whether local file dst exists and holds what r
// reads.
func sameContent(r io.Reader, dst string) (same, exists bool) {
	g, err := os.Open(dst)
	if err != nil {
		return false, !errors.Is(err, fs.ErrNotExist)
	}
	defer g.Close()
	a, b := make([]byte, 32<<10), make([]byte, 32<<10+1)
	for {
		n, errA := io.ReadFull(r, a)
		want := n
		if errA != nil {
			want = n + 1 // r has ended: so must dst
		}
		m, _ := io.ReadFull(g, b[:want])
		if m != n || !bytes.Equal(a[:n], b[:m]) {
			return false, true
		}
		if errA != nil {
			return true, true
		}
	}
}

// printFiles lists a directory of a workspace.
func printFiles(w, errw io.Writer, list []client.File) {
	if len(list) == 0 {
		fmt.Fprintln(errw, "no files there")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tSIZE\tMODE\tMODIFIED")
	for _, fi := range list {
		p := fi.Path
		size := sizeText(fi.Size)
		if fi.Type == "dir" {
			p, size = p+"/", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p, size, fi.Mode, fi.ModTime.Local().Format("2006-01-02 15:04:05"))
	}
	tw.Flush()
}
