//go:build !linux || sandloop_jailinit

package jail

// The init program itself (and non-Linux builds) embed no init.
var initBinary []byte

var initBuildArgs []string
