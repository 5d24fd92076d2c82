package jail

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestConfigEndsWithTheValue: the last byte the host writes of a jail's
// configuration is one the init needs. The init closes its end of the
// pipe as soon as it has decoded the value, so a byte written after the
// value (json.Encoder's newline) could meet a closed pipe: when the
// pipe's buffer split the host's write just before that byte (a
// configuration of a multiple of 64 KiB, as a zygote template's can be),
// the start failed with "configure jail: write |1: broken pipe"
// (TestSmallReaper's flake under load). Here the init is given all the
// host writes but its last byte, as it had it when the write was split
// there: it must not have its configuration yet.
func TestConfigEndsWithTheValue(t *testing.T) {
	cfg := initConfig{Path: "/bin/true", Files: []File{{Path: "f", Data: make([]byte, 1<<20)}}}
	var sent bytes.Buffer
	if err := sendConfig(&sent, &cfg); err != nil {
		t.Fatal(err)
	}
	b := sent.Bytes()
	var whole initConfig
	if err := readConfig(bytes.NewReader(b), &whole); err != nil || whole.Path != cfg.Path || len(whole.Files) != 1 || len(whole.Files[0].Data) != 1<<20 {
		t.Fatalf("from the whole configuration the init read path %q, %d files, %v", whole.Path, len(whole.Files), err)
	}
	var cut initConfig
	if err := readConfig(bytes.NewReader(b[:len(b)-1]), &cut); err == nil {
		t.Errorf("the init has its configuration without the last of the %d bytes the host writes (%q): it can close its end before the host has written that byte", len(b), b[len(b)-1:])
	}
}

// TestInitEndReported: a start that fails because its init ended before
// it took its configuration says how the init ended (a signal, an exit
// status), not only that the configuration's pipe was closed.
func TestInitEndReported(t *testing.T) {
	cfg := &Config{Path: "/bin/true", Workspace: testWorkspace(t)}
	initStarted = func(c *Config, pid int) {
		if c != cfg {
			return
		}
		// Our child, not yet waited for: its number is its own.
		if err := unix.Kill(pid, unix.SIGKILL); err != nil {
			t.Errorf("kill the init: %v", err)
			return
		}
		// Until it is a zombie (left for the start to reap).
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			t.Errorf("wait for the init: %v", err)
		}
	}
	t.Cleanup(func() { initStarted = nil })
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "the jail's init had ended: signal: killed") {
		t.Fatalf("Run of a jail whose init was killed before its configuration: %v, want it to say the init had been killed", err)
	}
}
