// Package egresstest builds a small world for egress tests on this machine:
// a test certificate authority, HTTPS servers under test names, a resolver
// that maps those names to local addresses, and a PEP 503 package index
// serving a wheel built with the system's setuptools and wheel.
package egresstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA's certificate, to trust it (SSL_CERT_FILE, PIP_CERT).
	PEM []byte
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sandloop test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server starts an HTTPS server on loopback whose certificate the CA signed
// for names.
func (ca *CA) Server(t testing.TB, h http.Handler, names ...string) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: names, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// Resolver returns a resolver hook that maps names to addresses and
// resolves nothing else (as a name under .invalid would not).
func Resolver(names map[string][]string) func(context.Context, string) ([]netip.Addr, error) {
	return func(_ context.Context, host string) ([]netip.Addr, error) {
		var out []netip.Addr
		for _, a := range names[host] {
			out = append(out, netip.MustParseAddr(a))
		}
		if len(out) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return out, nil
	}
}

// Port returns a test server's port.
func Port(srv *httptest.Server) int {
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// Python is the interpreter that builds wheels (never the first python3 on
// PATH, which may be a shim in a home directory).
const Python = "/usr/bin/python3"

// BuildWheel builds a wheel of a one-module distribution name==version
// (the module prints nothing and defines VALUE = value) with setuptools and
// wheel, into dir, and returns its path. It skips the test where they are
// missing (scripts/deps.sh installs them).
func BuildWheel(t testing.TB, dir, name, version, value string) string {
	t.Helper()
	if err := exec.Command(Python, "-c", "import setuptools, wheel").Run(); err != nil {
		t.Skipf("setuptools and wheel are needed to build a test wheel (scripts/deps.sh installs python3-setuptools and python3-wheel): %v", err)
	}
	src := t.TempDir()
	mod := strings.ReplaceAll(name, "-", "_")
	files := map[string]string{
		"setup.py":  fmt.Sprintf("from setuptools import setup\nsetup(name=%q, version=%q, py_modules=[%q])\n", name, version, mod),
		mod + ".py": fmt.Sprintf("VALUE = %q\n", value),
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(src, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(Python, "setup.py", "-q", "bdist_wheel", "-d", dir)
	cmd.Dir = src
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + src, "PYTHONDONTWRITEBYTECODE=1"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build wheel: %v\n%s", err, out)
	}
	matches, _ := filepath.Glob(filepath.Join(dir, mod+"-"+version+"-*.whl"))
	if len(matches) != 1 {
		t.Fatalf("build wheel: found %v", matches)
	}
	return matches[0]
}

// Index is a PEP 503 "simple" package index serving the wheels in dir:
// /simple/ lists the projects, /simple/NAME/ links their files (with
// sha256 fragments), /files/FILE serves them.
func Index(dir string) http.Handler {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(s))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wheels, _ := filepath.Glob(filepath.Join(dir, "*.whl"))
		projects := map[string][]string{}
		for _, p := range wheels {
			base := filepath.Base(p)
			projects[norm(strings.SplitN(base, "-", 2)[0])] = append(projects[norm(strings.SplitN(base, "-", 2)[0])], base)
		}
		switch {
		case r.URL.Path == "/simple/":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
			for name := range projects {
				fmt.Fprintf(w, "<a href=\"/simple/%s/\">%s</a>\n", name, name)
			}
			fmt.Fprint(w, "</body></html>\n")
		case strings.HasPrefix(r.URL.Path, "/simple/"):
			name := norm(strings.Trim(strings.TrimPrefix(r.URL.Path, "/simple/"), "/"))
			files, ok := projects[name]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
			for _, f := range files {
				b, _ := os.ReadFile(filepath.Join(dir, f))
				sum := sha256.Sum256(b)
				fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", f, hex.EncodeToString(sum[:]), f)
			}
			fmt.Fprint(w, "</body></html>\n")
		case strings.HasPrefix(r.URL.Path, "/files/"):
			http.ServeFile(w, r, filepath.Join(dir, filepath.Base(r.URL.Path)))
		default:
			http.NotFound(w, r)
		}
	})
}
