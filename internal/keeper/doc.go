// Package keeper keeps sessions alive across restarts of the server
// (`serve --keep-sessions`): one small process per data directory holds
// the sessions' jails and their descriptors, so that a server killed (-9
// included) or upgraded (SIGTERM, then the new binary) is followed by one
// that takes every live session over, with the same id, owner, limits,
// variables and files.
//
// # The keeper
//
// The keeper is this same binary started under the name "sandloop-keeper"
// with the directory (DATA-DIR/keeper) as its argument (MaybeRun), by the
// first server that needs it (Connect), detached: in a session of its own
// (setsid), no parent death signal, stdio on /dev/null, its log in
// keeper.log. It takes an exclusive lock (keeper.lock), so there is one
// per directory, writes its PID to keeper.pid and listens on keeper.sock
// (a unix SOCK_SEQPACKET socket, mode 0600): one JSON message per request
// and reply, descriptors beside it (SCM_RIGHTS), the pattern of systemd's
// file descriptor store. It is as small as its work allows: no network
// socket, no file but its own, not dumpable, no directory held; it never
// reads what the sandboxes write. It keeps its privileges: it starts the
// jails (their user namespaces map the sandbox user, as the server's do).
//
// It does three things for the server:
//
//   - spawn: it starts a jail's init (the command the server built,
//     descriptors and all: package jail, Config.Spawn) as its own child,
//     from one thread locked for its life, with Pdeathsig SIGKILL: the
//     jail dies with the keeper, never with the server. It sends back a
//     pidfd, by which the server signals the jail and learns of its end
//     (the exit status comes through the init's status pipe, as for any
//     jail); the keeper reaps the init.
//   - keep: the server hands it copies of a live session's descriptors
//     (the jail's pidfd and status pipe, the egress listener, the
//     kernel's request, event, stdout and stderr pipes and its state
//     socket) with the session's metadata (opaque here: id, owner, limits,
//     environment, network policy, workspace, cgroup, the kernel's marker
//     token...), replacing the record of the same id (a restarted
//     kernel). The metadata is also written to sessions/ID.json; at its
//     start a keeper moves the files a dead one left to lost/: the
//     sessions that died with it (for diagnosis: the server restores
//     them from its own records and their snapshots).
//   - list: a server starting on the same directory asks for every
//     record, descriptors included, and rebuilds its sessions from them.
//
// A jail spawned on a connection and not kept (a pool's spare, a session
// still starting, a kernel replaced by a restart, a session dropped) is
// killed when that connection closes, so a server that dies leaks no
// process it had not handed over. A record goes when the server drops it
// (the session is being closed) or when its jail's init ends.
//
// # Taking sessions over
//
// The server (package host) lists the records before it makes any
// workspace, removes the keeper's workspaces no record names (sessions
// that died while no server held them), and takes each session over
// (session.Reattach): jail.Attach rebuilds the jail from its pidfd,
// status pipe, listener and cgroup; kernel.Attach resyncs the kernel: it
// writes a newline (ending a request left half-written) and a "sync"
// request with a random tag, and reads until its reply, skipping what is
// not an event (the server before may have read half a line). A cell
// that was running when the server died goes on and completes: its
// output is dropped (its client is gone), its effects and its
// execution_count are kept, and the next request waits for it, bounded
// by the session's execution timeout from the take-over (then it is
// interrupted as a timeout would). A session with an allowlist gets a new
// egress gate on the same listener (its byte budget and log start again);
// a paused one is thawed; checkpoints are not carried over (the kernel's
// dormant copies are dropped: the sync lists them). An upload cut off by
// the server's death stores nothing: files are written to a temporary
// name and renamed, and the temporary file is removed at the take-over.
// Sessions kept this way start cold (a zygote's forks live in the
// zygote's jail, which the server owns) in workspaces that are host
// directories named after the keeper (jail.NewQuotaDirFor: root only),
// which another sandloop sweeps only once the keeper is gone. On SIGTERM
// the server lets go of its sessions (session.Manager.Detach) rather than
// closing them; a client's open stream then ends with status "killed"
// and a message saying that the cell goes on.
//
// If the keeper itself dies, every jail it spawned dies with it
// (Pdeathsig). The sessions are not lost: the server writes them to the
// snapshot store as they change (session.ManagerOptions.SnapshotEvery)
// and keeps a record of each (DATA-DIR/session-records). A server still
// running learns of the death at once (Client.Dead: the keeper's end of
// the watch socket closes) and puts the dead keeper's sessions to sleep
// on their latest snapshots (session.Manager.KeeperDied): each wakes at
// its next use in a new keeper, saying what was lost. A server started
// after brings back every recorded session it did not take over the same
// way (session.Manager.Restore). The records in lost/ are the keeper's
// own account, kept for diagnosis.
package keeper

// Arg0 is argv[0] of the keeper process.
const Arg0 = "sandloop-keeper"
