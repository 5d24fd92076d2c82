package main

import (
	"errors"
	"strings"
	"testing"
)

func TestCLILogger(t *testing.T) {
	var b strings.Builder
	log := cliLogger(&b, false).With("component", "zygote")
	log.Info("zygote ready", "pid", 1)
	log.Warn("sessions start cold", "err", errors.New("no cgroups"))
	if got, want := b.String(), "sandloop: sessions start cold: no cgroups\n"; got != want {
		t.Errorf("plain output = %q, want %q", got, want)
	}
	b.Reset()
	cliLogger(&b, true).Info("zygote ready", "pid", 1)
	if !strings.Contains(b.String(), `level=INFO msg="zygote ready" pid=1`) {
		t.Errorf("verbose output = %q, want the record as slog text", b.String())
	}
}
