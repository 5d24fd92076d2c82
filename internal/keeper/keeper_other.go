//go:build !linux

package keeper

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
)

// errUnsupported: the keeper passes descriptors and pidfds, Linux only.
var errUnsupported = errors.New("keeper: needs Linux")

// MaybeRun does nothing where keepers are unsupported.
func MaybeRun() {}

// Client: see the Linux build.
type Client struct{}

// Record: see the Linux build.
type Record struct {
	ID    string
	Pid   int
	Meta  json.RawMessage
	Files []*os.File
}

// Connect fails: keepers need Linux.
func Connect(string, string) (*Client, error) { return nil, errUnsupported }

func (*Client) Pid() int                                   { return 0 }
func (*Client) Dead() <-chan struct{}                      { return nil }
func (*Client) Close() error                               { return nil }
func (*Client) Spawn(*exec.Cmd) (int, *os.File, error)     { return 0, nil, errUnsupported }
func (*Client) Keep(string, int, []byte, []*os.File) error { return errUnsupported }
func (*Client) Drop(string) error                          { return errUnsupported }
func (*Client) List() ([]Record, error)                    { return nil, errUnsupported }
