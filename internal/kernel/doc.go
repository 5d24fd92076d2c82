// Package kernel runs Python cells like a notebook: kernel.py (embedded)
// and the Go side of its protocol — execute, interrupt, events,
// checkpoints and the export of a kernel's variables.
//
// # Checkpoints
//
// A checkpoint is a dormant fork of the kernel process, inside the
// session's own jail. Checkpoint asks kernel.py to fork: the child keeps the
// parent's memory copy-on-write and blocks on a socket of its own (it never
// reads the request pipe); the parent goes on. Where the kernel has no
// other thread it answers first and forks right after, before it reads
// the next request: nothing can change its memory in between, so the copy
// is of the moment of the answer, and the fork's few milliseconds (page
// tables) are spent while the host goes on (the workspace's copy, the
// caller's next step), not on the checkpoint's reply; a request sent at
// once waits for the fork. If that fork fails (the session's process
// limit, out of memory), the checkpoint is reported gone at its restore,
// with the reason (LostError). With threads the fork comes first and the
// answer after, as a failure to fork is then an error of Checkpoint. The child is in
// the session's cgroup, so the memory it holds is charged to the session:
// at first almost nothing (the page tables), then every page the live
// kernel writes after the checkpoint, which the checkpoint keeps the old
// copy of (CheckpointMemory measures it: the Private_Clean and
// Private_Dirty of its smaps_rollup). Each dormant copy names itself
// "sl-cpN" (its comm), so the host can also read that figure itself,
// without the kernel's turn (CopiesMemory); a copy that wakes takes the
// live kernel's name back.
//
// Restore to N: the live kernel points its own ends of the host's pipes at
// /dev/null (its threads may run until it exits: nothing they write may
// reach the host; undone if N turns out to be gone) and sends N's process a
// wake message carrying its checkpoint table (with its ends of every
// checkpoint's socket, so the woken kernel can restore checkpoints taken
// after its own) and any request bytes it had read ahead. N tells the old
// live kernel, which exits, answers on the same event pipe as the live
// kernel, with its own execution count, which Kernel takes over, and only
// then forks a fresh dormant copy of itself, so the checkpoint can be
// restored again: that fork (page tables: about a millisecond per few
// hundred MB) is off the restore's reply, beside the host's restore of the
// files; a request sent at once is read after it. Nothing of the user's
// runs between the wake and that fork, and the copy closes what the wake
// gave the live kernel (its ends of the checkpoints' sockets). If that
// fork fails (out of memory) the restore still stands but N is used up:
// it is reported gone.
//
// The host signals and waits for one process, the kernel's first (PID 2
// of a zygote-forked session; the program of a cold jail, which the init
// forwards signals to): it must live as long as the session. So at the
// first restore that process does not exit: it becomes the anchor, a tiny
// `python3 -I -S` program (a few MiB) and a child subreaper, to which every
// orphaned kernel process comes. The anchor forwards SIGINT (and the other
// signals the init forwards) to the live kernel, whose pid each new live
// kernel writes to a control pipe, reaps orphans, and when the live kernel
// dies exits with its status, a signal death as the same signal. So an
// interrupt, a timeout kill, an OOM kill or a segfault of a restored kernel
// ends the execution and the session exactly as before.
//
// Carried: everything the process's memory holds — variables, imported modules,
// the random module's and numpy's generator states (the random module's
// reseeding in a forked child is undone), the execution count, the current
// directory, os.environ, open files' descriptors (their file offsets are
// shared with the live kernel, as fork shares them). The process itself is
// another one after a restore: os.getpid() changes. Not carried, and
// reported by CheckpointInfo: threads other than the main one (fork copies
// one thread: a restored kernel has none of them; their Thread objects say
// not alive) and child processes and background servers (they keep running
// after a restore; they are not rolled back, and are no longer the restored
// kernel's children). Sockets are shared, not copied: a connection opened
// before the checkpoint is the same connection after a restore. Files in
// the workspace are not part of a kernel checkpoint (the session copies
// them; see internal/workspace).
//
// A checkpoint whose process died (the OOM killer may pick it: it is in the
// session's cgroup; so can user code, which may kill any process of its
// session) is reported as gone (ErrCheckpointGone) and stays listed until
// dropped; it is never half restored. A kernel keeps at most 200
// checkpoints (one descriptor each in a wake message).
//
// Costs (BenchmarkCheckpointDataFrame, a 100 MB DataFrame): a checkpoint
// is one fork, a few milliseconds (the page tables of the kernel's memory
// are copied: 2-5 ms for this ~150 MB process), made after the answer, so
// Checkpoint itself takes about half a millisecond (0.51 ms p50 at load
// 6.6; 4.2 ms when the answer waited for the fork); a restore is two
// process hand-offs, then one fork (the fresh dormant copy) after the
// reply: 3.4 ms p50 at that load, 32x faster than re-running the cell
// that built the DataFrame (108 ms); under heavy load both grow with the
// machine's scheduling delays (each is a few process wake-ups). The
// forks after the answers, the old live kernel's exit (freeing what it
// alone held) and, at the first restore, the anchor's exec (about 15 ms
// of CPU) are off the reply's path but use CPU beside the next request,
// which waits for the forks.
//
// Why not CRIU: it would checkpoint the whole process tree to files, and
// restore into new namespaces, but Debian 12's CRIU (3.17) does not start on
// recent kernels (`criu check`: "Unexpected rt vDSO area bounds" on 6.18),
// needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) that the jail gives no
// process, and copies the memory out instead of sharing it copy-on-write.
// A fork needs no privilege and no system call the jail's seccomp filter
// refuses (fork/clone without namespace flags, pipe2, socketpair, execve
// and prctl(PR_SET_CHILD_SUBREAPER) are allowed), takes milliseconds, and
// shares every unchanged page. Its limit is that it stays inside the
// process: threads, children and the kernel's outside connections are not
// part of it, and it cannot move to another host or survive the session.
//
// # State export
//
// ExportState streams the user's variables (the __main__ namespace) for a
// new session: a forked copy of the live kernel (or of a checkpoint's
// process) serializes them, so the live kernel stalls only for the fork.
// Each variable is serialized on its own: first by the C pickler
// (protocol 5; large buffers, a numpy array's or a pandas block's memory,
// go out of band, written to the stream straight from the object's
// memory), and where it refuses (lambdas, functions and classes defined
// in cells, and what refers to them: the C pickler would save those by a
// name the new kernel does not have yet) by dill where it is installed
// (Debian's python3-dill); modules are saved by name and imported again.
// A variable that does not serialize is listed in the manifest with the
// reason (an open socket: "cannot pickle 'socket' object"); the others are
// saved. Two names for one object come back as two copies. The kernel's
// own builtins (display, the input stub) are not in __main__ and are left
// alone.
//
// The bytes go on the state channel: a unix seqpacket socket, the
// kernel's fd 7 (Files.State), on which the kernel passes the host the
// read end of a fresh pipe per export (F_SETPIPE_SZ 1 MiB where allowed)
// and the host passes the kernel one per import; the records go raw
// through the pipe (no base64, no JSON), beside the event pipe. So
// StartExport returns as soon as the copy exists (the request's reply
// comes then, with the threads and child processes the state cannot
// carry, if asked): the kernel runs its next cell while Export.Wait
// streams the bytes; the copy is reaped at a later request. The host
// takes a passed descriptor only for the request it waits for, and only
// a pipe. A launcher that does not pass fd 7 (or passes something else
// than a unix seqpacket socket) gets the old path: the same records as
// base64 state_data events on the event pipe, the kernel answering
// nothing else until the stream has ended. Either kernel loads either.
//
// ImportState loads a stream into another kernel (the stream is parsed
// there only: nothing of it runs on the host), reseeds the random module
// and numpy's global generator (a copy must not repeat its source's draws;
// generator objects held in variables are copied as they are, and uuid4
// draws from os.urandom in every copy), and sets the execution count to
// the exported one. Out-of-band buffers are read from the pipe into
// writable bytearrays that the loaded arrays use as they are (one copy).
//
// ImportStateFile loads a whole export kept in a state file
// (NewStateFile: a memfd; SealStateFile: sealed against any write, resize
// or unseal). The kernel is given the file on the state channel and maps
// it copy-on-write (MAP_PRIVATE) instead of reading it: out-of-band
// buffers (which the export aligns to 64 bytes with P records) become
// views of the mapping that the loaded arrays use in place. Any number of
// kernels can map one file: they share its pages until one writes, and a
// write copies the page into the writer's own memory only. A kernel can
// change nothing that another sees (the seals hold for every descriptor
// and mapping, even one reopened through /proc), and no descriptor of it
// stays open in the kernel (it is mapped by mmap(2) itself, not Python's
// mmap module, which keeps one). The mapping lives as long as an array
// loaded over it, which keeps the whole file mapped (shared, not private,
// memory). An unsealed file, or a kernel without the state
// channel, is read as ImportState reads.
//
// StartExportOver gives an export earlier state files (StateBase: sealed,
// named by the caller's serials; the last export first, then the files
// it refers to). The copy that serializes maps them (shared, read-only)
// and indexes the last export's buffers by variable name and position; a
// buffer of the same size at the same place whose bytes are equal is
// written as an R record (serial, offset, length) instead of a B record
// with its bytes. Equality is proven by content, so nothing that ran
// between the two exports (cells, a restore, a fork of another kernel)
// can make it wrong, in one of two ways. By its pages: in a kernel loaded
// from those files (a fork's child forking again), the buffer lies in its
// mapping of the very file that holds the bytes, at their offset
// (/proc/self/maps: device, inode, offset), and /proc/self/pagemap says
// every page of it is the file's own (present and a file page) or not
// faulted in (which reads the file); the file is sealed, so those pages
// hold its bytes. A page written since is an anonymous copy (or swapped:
// anonymous too), and then the bytes are compared. This costs 8 bytes of
// pagemap a page, not a read of the buffer. By its bytes otherwise
// (memcmp against the mapping, the file's range populated in one call,
// MADV_POPULATE_READ): the cost of an unchanged 100 MB DataFrame of a
// session's own memory (anonymous pages carry no such proof: without
// soft-dirty, and with userfaultfd refused by the jail's seccomp, nothing
// says which were written) is a read of it and of the earlier file (tens
// of milliseconds) instead of 100 MB of new pages (hundreds under load).
// The manifest says how many bytes each proof took (MappedBytes,
// ComparedBytes); ExportByBytes turns the first off (the baseline of
// benchmarks). The manifest's Refs name the files referred to;
// ImportStateFiles passes them with the stream's file, and the importer
// maps them as it maps the stream, so the loaded arrays are views of the
// earliest file that holds their bytes. A buffer changed in place, even
// by one byte, is copied whole (no page-level reuse: an array must stay
// one contiguous run of memory). Bases are ignored for a checkpoint's
// export and for a kernel without the state channel.
//
// Remapped exports (RemapExport): a root session's buffers are its own
// anonymous memory, so its forks' exports compared them with the last
// export's bytes (32 ms of the 47 ms of a fork holding 100 MB). After an
// export of the live kernel (StartExportOver, fromCheckpoint 0) the
// manifest's Remap lists [address, offset, length] of each buffer of 64
// KiB or more that it wrote and that is the whole of one of glibc
// malloc's mmap'd blocks (numpy's arrays above malloc's mmap threshold,
// 128 KiB rising to at most 32 MiB as such blocks are freed: the blocks of
// a large DataFrame; not the brk heap, whose freed pages would stay
// mapped and be trimmed with MADV_DONTNEED), laid out in the stream at the same offset
// in a page as in the kernel (its P record pads to that, up to a page, not
// to 64 bytes: a child's array is as aligned as the parent's, at least
// 16). The host gives the sealed file back with those ranges (op
// remap_export, between cells, in pieces of about 4 MiB, each under the
// session's turn: session's remap.go), and the kernel replaces every run
// of 16 or more whole pages inside a range that still equals the file by
// a private mapping of the file at that offset (MAP_PRIVATE|MAP_FIXED,
// its page table populated). The next export then proves those pages
// unchanged by pagemap as for a child (the partial pages at a buffer's
// ends stay anonymous and are compared: _Reuse.find). No write can be
// lost: the comparison comes right before the mapping, in the kernel's
// loop between cells, with every signal blocked (a Python handler), the
// collector off (a finalizer) and the C functions called holding the GIL,
// and the kernel refuses (Remapped.Threads) while any other Python thread
// exists (a numpy loop in a thread runs without the GIL), so nothing
// else runs between the two; bytes found different stay as they are.
// Whatever lies at the address by then (the same array, another object,
// freed memory) keeps its bytes: only private, writable anonymous memory
// outside the brk heap, or an earlier remap's, is replaced, never a
// shared or file mapping. What changes is the kind of memory: free()
// unmaps the block as before; glibc's realloc of a block now spanning
// several mappings gets EFAULT from mremap and falls back to malloc, copy
// and free; MADV_DONTNEED would make a page read the file's bytes again
// instead of zeros (glibc never madvises an mmap'd block); a fork
// (checkpoint, export) copies the mapping copy-on-write like anonymous
// memory, and skips copying its page table while it has no written page.
// Over an earlier remap, every equal page is mapped again (a page of an
// earlier file left behind would keep that file alive); elsewhere runs
// shorter than 16 pages are left anonymous (each mapping is a VMA).
// Trade-offs: the comparison is still paid once per export, after the fork instead of in it (tens of
// milliseconds of the kernel's time, a cell waits for one piece); the
// file's pages belong to the memory cgroup that first touched them (the
// server's, which wrote the file), so the remapped bytes leave the
// session's memory charge until it writes them (the file was already
// held by the server for the session's next fork: the session now shares
// it instead of keeping a second copy; the session package bounds what a
// session may hold so: its charge plus its still-mapped bytes within its
// memory limit before each remap, so at most twice its limit in all, and
// its cache of exports within twice its limit), and a file stays alive while any
// remapped page of it does, even after the next fork replaced it in the
// server's cache (a buffer unchanged across exports keeps pointing to the
// oldest file holding it, as a child's does). C threads that write
// Python buffers on their own, outside any call from a Python thread,
// would not be seen by the thread check (none do in numpy or pandas).
//
// StartExport into a regular file (a state file) moves the bytes from the
// pipe with splice(2), not through the server's memory, and follows the
// records from the file afterwards. dill is imported only when a value
// needs it (its import costs tens of milliseconds, in every export's copy
// and every import).
//
// Costs (BenchmarkExportImportDataFrame, a 100 MB DataFrame, on this
// project's shared 2-core test machine, the old and the new code run one
// after the other, 5 iterations each): at load 3, export 0.91-0.96 s
// before, 0.06 s after (15x); import 0.87-0.89 s before, 0.11-0.13 s
// after (7x); at load 11, export 2.6 s and import 1.9 s before, 0.20 s
// and 0.27 s after. Rebuilding the DataFrame by re-running its cell took
// 0.08-0.11 s at load 3: an import is about as costly as that. Still far
// more than a checkpoint: every byte is copied out of the source and into
// the destination kernel.
package kernel
