package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/jail"
)

// doctor's jail line says how its Python ended: a timeout or an OOM kill
// by name, never a bare "exited 137" with nothing after it.
func TestDoctorJailFailureSaysWhy(t *testing.T) {
	for _, c := range []struct {
		name   string
		res    jail.Result
		stderr string
		want   []string
	}{
		{"timeout", jail.Result{ExitCode: 137, Signal: "killed", TimedOut: true}, "", []string{"did not finish within 1m30s", "numpy", "--timeout"}},
		{"oom", jail.Result{ExitCode: 137, Signal: "killed", OOMKilled: true}, "", []string{"OOM killer", "1024 MiB"}},
		{"signal", jail.Result{ExitCode: 139, Signal: "segmentation fault"}, "", []string{"killed by segmentation fault"}},
		{"error", jail.Result{ExitCode: 1}, "Traceback ...\nImportError: x\n", []string{"python exited 1 in the sandbox: Traceback ...\nImportError: x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := doctorJailFailure(&c.res, []byte(c.stderr), 90*time.Second)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q, want it to say %q", got, w)
				}
			}
			if strings.HasSuffix(got, ": ") || strings.Contains(got, "exited 137") {
				t.Errorf("%q: a bare exit status", got)
			}
		})
	}
}
