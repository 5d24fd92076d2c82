package zygote

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"sync"
	"time"
)

// The generated reaper (see reaperexe/README.md), when this binary was
// built after `go generate ./internal/zygote`, beside the source it must
// have been built from.
//
//go:embed reaperexe
var reaperexe embed.FS

// ReaperPath is where the template's jail holds the small reaper
// (read-only, like zygote.py): a session's reaper executes it once the
// session has taken it.
const ReaperPath = "/opt/sandloop/reaper"

// defaultReaperDelay is how long after its take a session's reaper keeps
// its Python loop before it executes the small reaper. Dropping its copy
// of the template (an execve that unmaps it) costs 3-7 ms of CPU, as its
// exit would: not while the session runs its first commands or a burst
// of sessions starts. A session closed before never executes it.
const defaultReaperDelay = 5 * time.Second

// reaperProgram returns the generated reaper, or nil and why not (the
// Python loop then reaps: more memory per idle session, never wrong).
var reaperProgram = sync.OnceValues(func() ([]byte, string) {
	bin, err := reaperexe.ReadFile("reaperexe/sandloop-reaper")
	if err != nil || len(bin) == 0 {
		return nil, "the Python loop (built without `go generate ./internal/zygote`)"
	}
	built, _ := reaperexe.ReadFile("reaperexe/source-hash")
	source, _ := reaperexe.ReadFile("reaperexe/reaper.c")
	sum := sha256.Sum256(source)
	if string(bytes.TrimSpace(built)) != hex.EncodeToString(sum[:]) {
		return nil, "the Python loop (its generated reaper is stale: run `go generate ./internal/zygote`)"
	}
	return bin, fmt.Sprintf("a small program (%d KB) after the take", len(bin)>>10)
})

// TrampolinePath is where the template's jail holds the trampoline
// (reaperexe/trampoline.c, read-only), which the template loads to make
// each spare with one copy of its page tables: the spare's reaper is the
// small reaper from the start, never a copy of the template.
const TrampolinePath = "/opt/sandloop/trampoline.so"

// trampolineProgram returns the generated trampoline, or nil and why not
// (spares are then made the slower way: the reaper is a copy of the
// template that forks the kernel, never wrong).
var trampolineProgram = sync.OnceValues(func() ([]byte, string) {
	so, err := reaperexe.ReadFile("reaperexe/sandloop-trampoline.so")
	if err != nil || len(so) == 0 {
		return nil, "built without `go generate ./internal/zygote`"
	}
	built, _ := reaperexe.ReadFile("reaperexe/trampoline-hash")
	source, _ := reaperexe.ReadFile("reaperexe/trampoline.c")
	sum := sha256.Sum256(source)
	if string(bytes.TrimSpace(built)) != hex.EncodeToString(sum[:]) {
		return nil, "its generated trampoline is stale: run `go generate ./internal/zygote`"
	}
	return so, ""
})

// useTrampoline says whether a template started with opts loads the
// trampoline (it also needs the small reaper).
func useTrampoline(opts *Options) bool {
	bin, _ := reaperProgram()
	so, _ := trampolineProgram()
	return bin != nil && so != nil && !opts.pythonReaper && !opts.noTrampoline
}

// ReaperInfo says how a forked session's PID 1 is made and what it runs
// once taken.
func ReaperInfo() string {
	bin, about := reaperProgram()
	if bin == nil {
		return about + "; each spare copies the template twice"
	}
	if _, why := trampolineProgram(); why != "" {
		return about + "; each spare copies the template twice (no trampoline: " + why + ")"
	}
	return fmt.Sprintf("a small program (%d KB) from the start, made by the trampoline: each spare copies the template once", len(bin)>>10)
}
