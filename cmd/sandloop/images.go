package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Displayed values at a terminal (repl, sessions exec): a terminal shows
// no image, so an image is written to a file and named; text is printed;
// other data is listed by its kinds.

var imageExt = map[string]string{"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg"}

// imageSaver writes the images code shows to Dir, as image-N.EXT.
type imageSaver struct {
	// Dir is where; if empty, a new temporary directory named Prefix...,
	// made on first use.
	Dir, Prefix string
	n           int
}

func (s *imageSaver) save(mime, value string) (string, error) {
	raw := []byte(value)
	if mime != "image/svg+xml" {
		var err error
		if raw, err = base64.StdEncoding.DecodeString(value); err != nil {
			return "", err
		}
	}
	if s.Dir == "" {
		dir, err := os.MkdirTemp("", s.Prefix+"*")
		if err != nil {
			return "", err
		}
		s.Dir = dir
	} else if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return "", err
	}
	for {
		s.n++
		path := filepath.Join(s.Dir, fmt.Sprintf("image-%d%s", s.n, imageExt[mime]))
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if os.IsExist(err) {
			continue // an earlier run's: kept
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(raw)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return path, err
	}
}

// showData prints a displayed value: its image saved and named, its text
// (a figure's "<Figure ...>" only if its image could not be saved), or
// else the kinds of data it has.
func showData(out, errw io.Writer, data map[string]string, images *imageSaver) {
	saved := false
	for _, mime := range []string{"image/png", "image/jpeg", "image/svg+xml"} {
		v, ok := data[mime]
		if !ok {
			continue
		}
		path, err := images.save(mime, v)
		if err != nil {
			fmt.Fprintf(errw, "sandloop: could not save the %s image: %v\n", mime, err)
		} else {
			fmt.Fprintf(out, "[image: %s]\n", path)
			saved = true
		}
		break
	}
	if text, ok := data["text/plain"]; ok && !(saved && strings.HasPrefix(text, "<Figure ")) {
		fmt.Fprintln(out, text)
		return
	}
	if !saved && len(data) > 0 {
		mimes := make([]string, 0, len(data))
		for m := range data {
			mimes = append(mimes, m)
		}
		slices.Sort(mimes)
		fmt.Fprintf(out, "[%s]\n", strings.Join(mimes, ", "))
	}
}
