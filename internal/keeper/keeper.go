// Package keeper keeps sessions alive across restarts of the server: one
// small process per data directory holds the sessions' jails and their
// descriptors, so that a server killed (-9 included) or upgraded is
// followed by one that takes every live session over.
//
// # Design
//
// The keeper is this same binary started under the name "sandloop-keeper"
// with the directory as its argument (MaybeRun), by the first server that
// needs it (Connect), detached: in a session of its own (setsid), no
// parent death signal, stdio on /dev/null and its log in keeper.log. It
// takes an exclusive lock (keeper.lock) so that there is one per
// directory, writes its PID to keeper.pid and listens on keeper.sock
// (a unix SOCK_SEQPACKET socket, mode 0600): one JSON message per request
// and reply, descriptors beside it (SCM_RIGHTS), the pattern of systemd's
// file descriptor store. It opens nothing else: no network socket, no
// file but its own; it never reads what the sandboxes write.
//
// It does three things for the server:
//
//   - spawn: it starts a jail's init (the command the server built,
//     descriptors and all; package jail, Config.Spawn) as its own child,
//     from one thread locked for its life, with Pdeathsig SIGKILL: the
//     jail dies with the keeper, never with the server. It sends back a
//     pidfd, by which the server signals the jail and learns of its end
//     (the exit status comes through the init's status pipe, as for any
//     jail), and it reaps the init itself.
//   - keep: the server hands it a copy of each live session's
//     descriptors (the jail's pidfd and status pipe, the egress
//     listener, the kernel's pipes and state socket) with the session's
//     metadata (opaque here: id, owner, limits, network policy, workspace,
//     cgroup, the kernel's pipe token...), replacing the previous record
//     of the same id (a restarted kernel). The metadata is also written
//     to sessions/ID.json (a snapshot can be taken of what was live when
//     the keeper itself died).
//   - list: a server starting on the same directory asks for every
//     record, descriptors included, and rebuilds its sessions from them.
//
// A jail spawned on a connection and not kept (a pool's spare, a session
// still starting, a kernel replaced by a restart) is killed when that
// connection closes, so a server that dies leaks nothing it had not handed
// over. A kept session's record goes when the server drops it (the session
// was closed) or when its init ends. If the keeper dies, every jail it
// spawned dies with it (Pdeathsig) and the server closes their sessions;
// their workspaces, named after the keeper's PID, are swept by the next
// sandloop (jail.OwnedTempDir's rule), their empty cgroups too.
package keeper

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Arg0 is argv[0] of the keeper process.
const Arg0 = "sandloop-keeper"

// Files in the keeper's directory.
const (
	sockName = "keeper.sock"
	lockName = "keeper.lock"
	pidName  = "keeper.pid"
	logName  = "keeper.log"
	metaDir  = "sessions"
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
