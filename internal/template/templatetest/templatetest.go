// Package templatetest builds templates for tests: a package index on
// loopback (package egresstest's) serving one small wheel, and the build
// options that let a template's build reach it.
package templatetest

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/egress/egresstest"
	"github.com/sandloop/sandloop/internal/template"
)

// Index is a PEP 503 index at https://pkgs.test:PORT/simple/ (on
// loopback, its own CA) serving the wheel of Module.
type Index struct {
	URL    string
	Module string // the wheel's module: VALUE = Value
	Dist   string // its distribution name
	Value  string
	opts   template.BuildOptions
}

// NewIndex starts the index with a wheel of distribution dist (module
// dist with '-' as '_'), version 1.0, whose module's VALUE is value.
func NewIndex(t testing.TB, dist, value string) *Index {
	t.Helper()
	ca := egresstest.NewCA(t)
	wheels := t.TempDir()
	egresstest.BuildWheel(t, wheels, dist, "1.0", value)
	srv := ca.Server(t, egresstest.Index(wheels), "pkgs.test")
	port := egresstest.Port(srv)
	al, err := egress.ParseAllowlist([]string{"pkgs.test:" + strconv.Itoa(port), "127.0.0.1"}) // loopback: refused unless named
	if err != nil {
		t.Fatal(err)
	}
	ix := &Index{URL: fmt.Sprintf("https://pkgs.test:%d/simple/", port), Dist: dist, Value: value}
	for _, r := range dist {
		if r == '-' {
			r = '_'
		}
		ix.Module += string(r)
	}
	ix.opts = template.BuildOptions{
		Egress: &egress.Policy{Allow: al},
		Lookup: egresstest.Resolver(map[string][]string{"pkgs.test": {"127.0.0.1"}}),
		Env:    []string{"PIP_INDEX_URL=" + ix.URL, "PIP_CERT=/workspace/ca.pem", "SSL_CERT_FILE=/workspace/ca.pem"},
		Files:  map[string][]byte{"ca.pem": ca.PEM},
	}
	return ix
}

// BuildOptions are the options of a build whose pip installs from the index.
func (ix *Index) BuildOptions() *template.BuildOptions {
	o := ix.opts
	return &o
}
