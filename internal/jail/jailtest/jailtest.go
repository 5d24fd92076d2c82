// Package jailtest helps the tests of packages that start jails.
package jailtest

import (
	"os"
	"testing"

	"github.com/sandloop/sandloop/internal/jail"
)

// Main runs m's tests, for a TestMain. The jail re-executes the running
// binary as a jail's init (and as its helpers); jail.MaybeInit serves
// those roles before any test runs.
func Main(m *testing.M) {
	jail.MaybeInit()
	os.Exit(m.Run())
}
