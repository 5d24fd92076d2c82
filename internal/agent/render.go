package agent

import (
	"github.com/sandloop/sandloop/internal/kernel"
	"github.com/sandloop/sandloop/internal/tools"
)

// cutMiddle keeps the start and end of s (max bytes in all) and says how
// much was cut between them.
func cutMiddle(s string, max int) string {
	return kernel.CutMiddle(s, max, "\n... [%d bytes cut from the middle; the full output is in the run's history] ...\n")
}

// PNGs returns the PNG images of a result (base64), in order: the
// figures the model sees and the CLI writes out.
func PNGs(r *kernel.Result) []string { return tools.PNGs(r) }
