package snapshot

import (
	"os/exec"
	"syscall"
)

// diesWithParent: the S3 server goes if the test binary is killed.
func diesWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
