//go:build !sandloop_init

package jail

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// The generated join program (see joinexe/README.md), when this binary was
// built after `go generate ./internal/jail`, beside the source it must have
// been built from.
//
//go:embed joinexe
var joinexe embed.FS

const joinexeName = "joinexe/sandloop-join"

// joinExecutable returns the join program, written once to the init's
// private cache directory, or "" and why not (joins then start the join
// script and the init in join mode: slower, never wrong).
var joinExecutable = sync.OnceValues(func() (path, about string) {
	const fallback = "the join script (python3) and the init in join mode"
	fi, err := fs.Stat(joinexe, joinexeName)
	if err != nil {
		return "", fallback + " (built without `go generate ./internal/jail`)"
	}
	built, _ := joinexe.ReadFile("joinexe/source-hash")
	source, _ := joinexe.ReadFile("joinexe/join.c")
	sum := sha256.Sum256(source)
	if string(bytes.TrimSpace(built)) != hex.EncodeToString(sum[:]) {
		return "", fallback + " (its generated join program is stale: run `go generate ./internal/jail`)"
	}
	id, _ := joinexe.ReadFile("joinexe/join-hash")
	if id = bytes.TrimSpace(id); len(id) < 16 {
		return "", fallback + " (its generated join program has no join-hash: run `go generate ./internal/jail`)"
	}
	path = filepath.Join(initCacheDir(), "sandloop-join-"+string(id[:16]))
	if err := ensureJoinProgram(path); err != nil {
		return "", fallback + " (" + err.Error() + ")"
	}
	now := time.Now()
	_ = os.Chtimes(path, now, now) // in use: not to be pruned (see ensureCached)
	return path, fmt.Sprintf("a small program (%d KB): %s", fi.Size()>>10, path)
})

func ensureJoinProgram(path string) error {
	return ensureCached(path, func() ([]byte, error) { return joinexe.ReadFile(joinexeName) })
}

// joinScriptOnly makes every join start the script (benchmarks and tests
// of the path without the program).
var joinScriptOnly atomic.Bool

// JoinScriptEnv, set to 1, makes this process's joins start the join
// script even with the join program (a benchmark's baseline).
const JoinScriptEnv = "SANDLOOP_JOIN_SCRIPT"

var joinScriptEnv = sync.OnceValue(func() bool { return os.Getenv(JoinScriptEnv) == "1" })

// joinUnusable holds why the cached join program could not be executed (a
// noexec mount): from then on this process's joins start the script.
var joinUnusable atomic.Pointer[string]

// joinProgPath is the join program a join starts, or "" for the script.
// The cached copy is checked at every join: another sandloop may have
// pruned it.
func joinProgPath() string {
	path, _ := joinExecutable()
	if path == "" || joinScriptOnly.Load() || joinScriptEnv() || joinUnusable.Load() != nil || ensureJoinProgram(path) != nil {
		return ""
	}
	return path
}

// giveUpJoinProgram records that the join program could not be started.
func giveUpJoinProgram(err error) {
	why := "the join script (python3) and the init in join mode (the join program could not be started: " + err.Error() + ")"
	joinUnusable.Store(&why)
}

// JoinInfo says what joins a running jail (a command of a session).
func JoinInfo() string {
	if why := joinUnusable.Load(); why != nil {
		return *why
	}
	if joinScriptEnv() {
		return "the join script (python3) and the init in join mode (" + JoinScriptEnv + "=1)"
	}
	_, about := joinExecutable()
	return about
}
