//go:build !sandloop_init

package jail

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
)

// The package's own sources, to tell whether the generated init (initexe)
// was built from them. (The pattern takes the tests too; SourceHash skips
// them.)
//
//go:embed *.go
var sourceFiles embed.FS

//go:generate go run ./initgen
//go:generate go run ./joingen

// SourceHash is a hash of this package's Go sources: the generated init
// records the one it was built from (see initexe/README.md).
var SourceHash = sync.OnceValue(func() string {
	entries, _ := sourceFiles.ReadDir(".") // sorted by name
	h := sha256.New()
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "_test.go") {
			continue // tests are not in the init
		}
		f, err := sourceFiles.Open(e.Name())
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%s\n", e.Name())
		io.Copy(h, f) // (ReadFile would copy it first)
		f.Close()
	}
	return hex.EncodeToString(h.Sum(nil))
})
