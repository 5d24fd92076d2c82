//go:build linux && !sandloop_jailinit

package jail

import _ "embed"

// The jail's init as a small program of its own (cmd/jailinit), rebuilt by
// `go generate ./internal/jail`; TestEmbeddedInitIsCurrent fails when it is
// stale. The tag keeps the init from embedding itself.
//
//go:generate sh -c "CGO_ENABLED=0 GOFLAGS= go build -tags sandloop_jailinit -trimpath -buildvcs=false -ldflags='-s -w -buildid=' -o jailinit.bin ./cmd/jailinit"
//go:embed jailinit.bin
var initBinary []byte

// initBuildArgs are the go build arguments of the go:generate line, for the
// freshness test.
var initBuildArgs = []string{"build", "-tags", "sandloop_jailinit", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid="}
