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

// Arg0 is argv[0] of the keeper process.
const Arg0 = "sandloop-keeper"
