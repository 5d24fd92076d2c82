//go:build !linux

package main

import "time"

// threadCPU is not measured here: the sampler's CPU is then counted as
// the host's.
func threadCPU() time.Duration { return 0 }
