//go:build !linux

package session

import (
	"errors"
	"os"
)

// dupFile needs Linux (state files are memfds): forks copy every export.
func dupFile(*os.File) (*os.File, error) { return nil, errors.New("needs Linux") }
