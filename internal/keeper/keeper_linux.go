package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Files in the keeper's directory.
const (
	sockName = "keeper.sock"
	lockName = "keeper.lock"
	pidName  = "keeper.pid"
	logName  = "keeper.log"
	metaDir  = "sessions"
	lostDir  = "lost"
)

// maxFDs bounds the descriptors of one message (the kernel's SCM_MAX_FD
// is 253).
const maxFDs = 253

// maxMessage bounds one message.
const maxMessage = 1 << 20

// request is one request to the keeper.
type request struct {
	Op    string          `json:"op"` // hello, spawn, keep, drop, list, watch
	Spawn *spawnSpec      `json:"spawn,omitempty"`
	ID    string          `json:"id,omitempty"`
	Pid   int             `json:"pid,omitempty"`
	Meta  json.RawMessage `json:"meta,omitempty"`
	Files int             `json:"files,omitempty"`
}

// reply is one reply; list sends one per record, then one with End.
type reply struct {
	Error  string          `json:"error,omitempty"`
	Errno  int             `json:"errno,omitempty"` // of Error, if it was a system call's
	Pid    int             `json:"pid,omitempty"`
	ID     string          `json:"id,omitempty"`
	Meta   json.RawMessage `json:"meta,omitempty"`
	Files  int             `json:"files,omitempty"`
	End    bool            `json:"end,omitempty"`
	Keeper int             `json:"keeper,omitempty"`
}

// spawnSpec is an exec.Cmd for the keeper to start; its descriptors
// (stdin, stdout, stderr, then the extra files) come with the message.
type spawnSpec struct {
	Path                       string                 `json:"path"`
	Args                       []string               `json:"args"`
	Env                        []string               `json:"env"`
	Cloneflags                 uintptr                `json:"clone_flags"`
	UidMappings                []syscall.SysProcIDMap `json:"uid_map"`
	GidMappings                []syscall.SysProcIDMap `json:"gid_map"`
	GidMappingsEnableSetgroups bool                   `json:"setgroups"`
	Credential                 *syscall.Credential    `json:"cred,omitempty"`
	AmbientCaps                []uintptr              `json:"caps,omitempty"`
	Setsid                     bool                   `json:"setsid"`
}

// send writes v and the descriptors fds as one message.
func send(sock int, v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("message of %d bytes: at most %d", len(b), maxMessage)
	}
	if len(fds) > maxFDs {
		return fmt.Errorf("%d descriptors: at most %d", len(fds), maxFDs)
	}
	var rights []byte
	if len(fds) > 0 {
		rights = unix.UnixRights(fds...)
	}
	for {
		err := unix.Sendmsg(sock, b, rights, nil, 0)
		if err == unix.EINTR {
			continue
		}
		return err
	}
}

// errBusyText is the keeper's answer to a second server.
const errBusyText = "another sandloop serve holds this keeper (one server per data directory)"

// errClosed is the other end gone.
var errClosed = errors.New("the keeper's connection was closed")

// receiver reads messages from one socket (its buffers are reused).
type receiver struct {
	sock     int
	buf, oob []byte
}

func newReceiver(sock int) *receiver {
	return &receiver{sock: sock, buf: make([]byte, maxMessage), oob: make([]byte, unix.CmsgSpace(4*maxFDs))}
}

// receive reads one message into v and returns its descriptors (as
// files: the caller closes them).
func (r *receiver) receive(v any) ([]*os.File, error) {
	sock, buf, oob := r.sock, r.buf, r.oob
	for {
		n, oobn, flags, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		var files []*os.File
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for i := range msgs {
				fds, _ := unix.ParseUnixRights(&msgs[i])
				for _, fd := range fds {
					files = append(files, os.NewFile(uintptr(fd), "keeper-fd"))
				}
			}
		}
		switch {
		case err != nil:
			closeFiles(files)
			return nil, err
		case n == 0:
			closeFiles(files)
			return nil, errClosed
		case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
			closeFiles(files)
			return nil, errors.New("a truncated message")
		}
		if err := json.Unmarshal(buf[:n], v); err != nil {
			closeFiles(files)
			return nil, fmt.Errorf("a bad message: %w", err)
		}
		return files, nil
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func fdsOf(files []*os.File) []int {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return fds
}
