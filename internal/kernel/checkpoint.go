package kernel

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// Errors of checkpoints.
var (
	// ErrCheckpointGone means the checkpoint's process has died (the
	// out-of-memory killer may pick it: it is charged to the session). It
	// cannot be restored; drop it.
	ErrCheckpointGone = errors.New("the checkpoint is gone: its process was killed (the session may have run out of memory)")
	// ErrNoCheckpoint means the kernel has no checkpoint of that id.
	ErrNoCheckpoint = errors.New("no such checkpoint")
)

// LostError is a checkpoint that is gone (errors.Is ErrCheckpointGone)
// because its copy could not be made: the kernel announces a checkpoint
// before it forks the copy (kernel.py checkpoint), and the fork failed.
type LostError struct {
	ID  int
	Why string // "cannot fork the kernel: ..."
}

func (e *LostError) Error() string {
	return fmt.Sprintf("checkpoint %d is gone: its copy of the kernel could not be made (%s)", e.ID, e.Why)
}

// Is makes a LostError an ErrCheckpointGone.
func (e *LostError) Is(target error) bool { return target == ErrCheckpointGone }

// CheckpointInfo describes a checkpoint.
type CheckpointInfo struct {
	ID             int      // assigned by the kernel, increasing from 1
	ExecutionCount int      // the kernel's count when it was taken
	Threads        []string // other threads, not carried
	Processes      []string // child processes, "PID COMMAND", not carried
}

// StateManifest says what ExportState wrote or ImportState loaded.
type StateManifest struct {
	Serializer     string     `json:"serializer"` // "dill" or "pickle"
	Variables      []string   `json:"variables"`  // names saved (or loaded)
	NotSaved       []NotSaved `json:"not_saved,omitempty"`
	ExecutionCount int        `json:"execution_count"`
	// Refs are the serials of the earlier state files (StateBase) the
	// export refers to instead of copying their bytes (StartExportOver);
	// an import of it needs them (ImportStateFiles).
	Refs []uint64 `json:"refs,omitempty"`
	// ComparedBytes and MappedBytes are the bytes of the buffers referred
	// to (Refs) that the export proved equal by comparing them, and by
	// their pages: those of a kernel loaded from the base files
	// (ImportStateFiles) that it has not written since are still the
	// files' own pages, which /proc/self/pagemap tells without reading
	// them (see kernel.py's _Reuse).
	ComparedBytes int64 `json:"compared_bytes,omitempty"`
	MappedBytes   int64 `json:"mapped_bytes,omitempty"`
	// Remap, of an export of the live kernel on the state channel, is
	// where each large buffer lay in the kernel when the export began and
	// where its bytes are in the stream: [address, offset, length], to
	// give back to the kernel with the sealed file (RemapExport).
	Remap [][3]uint64 `json:"remap,omitempty"`
}

// A StateBase is an earlier, sealed state file given to an export
// (StartExportOver) or an import (ImportStateFiles), named by a serial the
// caller chooses, unique among the files it keeps.
type StateBase struct {
	Serial uint64
	File   *os.File
}

// maxStateFiles bounds the files passed with one request (a state file
// and its bases), as kernel.py's MAX_STATE_FILES.
const maxStateFiles = 16

// ExportByBytes, if set, makes StartExportOver prove every buffer equal
// to its base's by comparing the bytes, never by its pages: the baseline
// of benchmarks.
var ExportByBytes atomic.Bool

// MaxStateBases is the most bases an export or import takes.
const MaxStateBases = maxStateFiles - 1

// NotSaved is a variable that could not be saved or loaded, and why.
type NotSaved struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// checkpointDeadline bounds a checkpoint request: the kernel forks (a few
// milliseconds per GiB of page tables) and answers.
const checkpointDeadline = 60 * time.Second

// Checkpoint takes a checkpoint of the kernel's memory: a dormant copy of
// the kernel process (see the package doc), restorable any number of times
// until dropped.
func (k *Kernel) Checkpoint(ctx context.Context) (*CheckpointInfo, error) {
	ev, err := k.call(ctx, map[string]any{"op": "checkpoint"}, "checkpoint", "a checkpoint", checkpointDeadline, nil)
	if err != nil {
		return nil, err
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("checkpoint: %s", ev.Reason)
	}
	return ev.info(), nil
}

// Restore puts the kernel back at checkpoint id (kept: it can be restored
// again). The kernel's execution count becomes the checkpoint's.
func (k *Kernel) Restore(ctx context.Context, id int) (*CheckpointInfo, error) {
	return k.restore(ctx, id, false)
}

// RestoreAndDrop is Restore then DropCheckpoint, in one step and cheaper
// (what an undo does): the checkpoint's copy becomes the live kernel and
// no fresh copy is made to keep it restorable. If it fails the checkpoint
// is kept, as after a failed Restore.
func (k *Kernel) RestoreAndDrop(ctx context.Context, id int) (*CheckpointInfo, error) {
	return k.restore(ctx, id, true)
}

func (k *Kernel) restore(ctx context.Context, id int, drop bool) (*CheckpointInfo, error) {
	k.fresh.Store(false)
	ev, err := k.call(ctx, map[string]any{"op": "restore", "id": id, "drop": drop}, "restore", "a restore", checkpointDeadline, func(ev *wireEvent) {
		if ev.Reason == "" && !ev.Gone {
			k.count = ev.ExecutionCount
		}
	})
	if err != nil {
		return nil, err
	}
	if err := ev.checkpointErr(id); err != nil {
		return nil, err
	}
	return ev.info(), nil
}

// DropCheckpoint ends checkpoint id's process, freeing its memory.
func (k *Kernel) DropCheckpoint(ctx context.Context, id int) error {
	ev, err := k.call(ctx, map[string]any{"op": "drop_checkpoint", "id": id}, "drop_checkpoint", "a request to drop a checkpoint", checkpointDeadline, nil)
	if err != nil {
		return err
	}
	return ev.checkpointErr(id)
}

// CheckpointMemory returns the private memory (bytes) each checkpoint holds
// now, by id: Private_Clean+Private_Dirty of its process's smaps_rollup,
// the pages it no longer shares with the live kernel or other checkpoints.
// A checkpoint whose process has died is left out (Restore reports it as
// ErrCheckpointGone).
func (k *Kernel) CheckpointMemory(ctx context.Context) (map[int]int64, error) {
	ev, err := k.call(ctx, map[string]any{"op": "checkpoint_memory"}, "checkpoint_memory", "a checkpoint memory request", checkpointDeadline, nil)
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(ev.Memory))
	for id, n := range ev.Memory {
		i, err := strconv.Atoi(id)
		if err != nil {
			return nil, fmt.Errorf("checkpoint memory: bad id %q", id)
		}
		out[i] = n
	}
	return out, nil
}

// ExportState writes the user's variables (the __main__ namespace) to w;
// fromCheckpoint > 0 exports a checkpoint's state instead of the live one.
// It is StartExport and Export.Wait. Variables that cannot be serialized
// are listed in the manifest's NotSaved, with the reason.
func (k *Kernel) ExportState(ctx context.Context, w io.Writer, fromCheckpoint int) (*StateManifest, error) {
	e, err := k.StartExport(ctx, w, fromCheckpoint, false)
	if err != nil {
		return nil, err
	}
	return e.Wait(ctx)
}

// Export is an export of a kernel's state under way (StartExport).
type Export struct {
	// Threads and Processes are what the state cannot carry (other
	// threads; child processes, "PID COMMAND"), if asked for.
	Threads   []string
	Processes []string

	f        *os.File // the state channel's pipe; nil when done already
	w        io.Writer
	manifest *StateManifest
}

// StartExport starts writing the user's variables to w (from checkpoint
// fromCheckpoint if > 0), serialized by a forked copy of the kernel (or of
// the checkpoint), and returns as soon as that copy exists: the kernel
// (and its next cell) goes on while Wait streams the bytes to w. With
// describe, the Export says which threads and child processes the state
// does not carry. A kernel without the state channel (a launcher that did
// not pass Files.State) streams on its event pipe instead: then
// StartExport returns when the whole state is written.
func (k *Kernel) StartExport(ctx context.Context, w io.Writer, fromCheckpoint int, describe bool) (*Export, error) {
	return k.StartExportOver(ctx, w, fromCheckpoint, describe, nil)
}

// StartExportOver is StartExport given earlier exports of this or any
// kernel, in sealed state files (bases[0] the last one, then the files
// it refers to): a large buffer (a numpy array's, a pandas block's) whose
// bytes equal those at the same place (variable, buffer) of bases[0] is
// written as a reference to them instead of a copy, so an unchanged
// DataFrame costs a comparison of its memory, not a new copy of it. The
// manifest's Refs name the bases referred to; an import needs them
// (ImportStateFiles). Bases are used only on the state channel, for the
// live kernel's state (fromCheckpoint 0); otherwise ignored.
func (k *Kernel) StartExportOver(ctx context.Context, w io.Writer, fromCheckpoint int, describe bool, bases []StateBase) (*Export, error) {
	e := &Export{w: w}
	if fromCheckpoint != 0 || len(bases) > MaxStateBases {
		bases = nil
	}
	if !k.stateChannel {
		if describe {
			ev, err := k.call(ctx, map[string]any{"op": "describe"}, "describe", "a description", checkpointDeadline, nil)
			if err != nil {
				return nil, fmt.Errorf("export state: %w", err)
			}
			e.Threads, e.Processes = ev.Threads, ev.Processes
		}
		s := &exportSink{w: w}
		ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "export_state", "checkpoint": fromCheckpoint}, sink: s, what: "an export of its state"})
		if err != nil {
			return nil, err
		}
		if err := exportErr(ev, fromCheckpoint); err != nil {
			return nil, err
		}
		if s.err != nil {
			return nil, fmt.Errorf("export state: write: %w", s.err)
		}
		if ev.Manifest == nil {
			return nil, errors.New("export state: the kernel sent no manifest")
		}
		e.manifest = ev.Manifest
		return e, nil
	}
	var f *os.File
	var ferr, sendErr error
	req := map[string]any{"op": "export_state", "checkpoint": fromCheckpoint, "channel": true, "describe": describe}
	if ExportByBytes.Load() {
		req["by_bytes"] = true
	}
	if fromCheckpoint == 0 {
		req["remap"] = true // large buffers laid out for RemapExport, and the manifest's Remap
	}
	var before func(int64)
	if len(bases) > 0 {
		req["bases"] = len(bases)
		files, serials := baseFiles(bases)
		before = func(tag int64) { sendErr = k.p.sendFiles(tag, files, 0, serials) }
	}
	ev, err := k.converse(ctx, conversation{
		req:  req,
		sink: &replySink{typ: "state_export", tagged: true}, what: "an export of its state", deadline: time.Now().Add(checkpointDeadline),
		before: before,
		onReply: func(ev *wireEvent) {
			if ev.Reason == "" && !ev.Gone {
				f, ferr = k.p.recvStream(k.tag)
			}
		}})
	if err != nil {
		return nil, err
	}
	if err := exportErr(ev, fromCheckpoint); err != nil {
		return nil, err
	}
	if sendErr != nil {
		if f != nil {
			f.Close()
		}
		return nil, fmt.Errorf("export state: pass its bases: %w", sendErr)
	}
	if ferr != nil {
		return nil, fmt.Errorf("export state: %w", ferr)
	}
	e.f, e.Threads, e.Processes = f, ev.Threads, ev.Processes
	return e, nil
}

func baseFiles(bases []StateBase) ([]*os.File, []uint64) {
	files := make([]*os.File, len(bases))
	serials := make([]uint64, len(bases))
	for i, b := range bases {
		files[i], serials[i] = b.File, b.Serial
	}
	return files, serials
}

func exportErr(ev *wireEvent, fromCheckpoint int) error {
	if fromCheckpoint > 0 {
		if err := ev.checkpointErr(fromCheckpoint); err != nil {
			return fmt.Errorf("export state: %w", err)
		}
	} else if ev.Reason != "" {
		return fmt.Errorf("export state: %s", ev.Reason)
	}
	return nil
}

// statePipeSize is asked of every state pipe (F_SETPIPE_SZ; above
// /proc/sys/fs/pipe-max-size the default 64 KiB stays), and is the size of
// the host's writes to one.
const statePipeSize = 1 << 20

// maxManifest bounds the end record of a state stream.
const maxManifest = 16 << 20

// Wait copies the rest of the state to the writer given to StartExport
// and returns the manifest. A ctx done abandons the export (the copy that
// serializes stops at its next write).
func (e *Export) Wait(ctx context.Context) (*StateManifest, error) {
	if e.f == nil {
		if e.manifest == nil {
			return nil, errors.New("export state: already waited for")
		}
		m := e.manifest
		e.manifest = nil
		return m, nil
	}
	defer e.Close()
	stop := context.AfterFunc(ctx, func() { e.f.Close() })
	defer stop()
	if f, ok := e.w.(*os.File); ok && isStateFile(f) {
		return e.waitFile(ctx, f)
	}
	var sc recordScanner
	buf := make([]byte, 1<<20)
	var werr error
	for {
		n, err := e.f.Read(buf)
		if n > 0 {
			if serr := sc.feed(buf[:n]); serr != nil {
				return nil, fmt.Errorf("export state: %w", serr)
			}
			if werr == nil {
				_, werr = e.w.Write(buf[:n])
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("export state: %w", err)
		}
	}
	if werr != nil {
		return nil, fmt.Errorf("export state: write: %w", werr)
	}
	if !sc.ended {
		return nil, errors.New("export state: the process serializing the variables died before the end (it may have run out of memory)")
	}
	var m StateManifest
	if err := json.Unmarshal(sc.end, &m); err != nil {
		return nil, fmt.Errorf("export state: bad manifest: %w", err)
	}
	return &m, nil
}

// waitFile is Wait into a state file (NewStateFile): the kernel moves
// the bytes from the pipe into the file (splice), they never pass through
// this process; the records are followed after, from the file.
func (e *Export) waitFile(ctx context.Context, f *os.File) (*StateManifest, error) {
	start, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, fmt.Errorf("export state: %w", err)
	}
	n, err := io.Copy(f, e.f) // splice(2) from the pipe
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("export state: %w", err)
	}
	var sc recordScanner
	var hdr [9]byte
	for off := start; off < start+n && !sc.ended; {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			return nil, fmt.Errorf("export state: read back: %w", err)
		}
		size := binary.BigEndian.Uint64(hdr[1:])
		if hdr[0] == 'E' {
			if size > maxManifest || off+9+int64(size) > start+n {
				return nil, errors.New("export state: a broken end record")
			}
			sc.end = make([]byte, size)
			if _, err := f.ReadAt(sc.end, off+9); err != nil {
				return nil, fmt.Errorf("export state: read back: %w", err)
			}
			sc.ended = true
			if off+9+int64(size) != start+n {
				return nil, errors.New("export state: bytes after the end of the state stream")
			}
			break
		}
		if size > uint64(start+n-off) {
			break // cut short: not ended
		}
		off += 9 + int64(size)
	}
	if !sc.ended {
		return nil, errors.New("export state: the process serializing the variables died before the end (it may have run out of memory)")
	}
	var m StateManifest
	if err := json.Unmarshal(sc.end, &m); err != nil {
		return nil, fmt.Errorf("export state: bad manifest: %w", err)
	}
	return &m, nil
}

// Close abandons the export if Wait has not finished it.
func (e *Export) Close() {
	if e.f != nil {
		e.f.Close()
	}
}

// recordScanner follows the records of a state stream (kind byte,
// big-endian length, payload; see kernel.py) to find its end record.
type recordScanner struct {
	hdr   [9]byte
	nh    int
	left  uint64
	end   []byte // the E record's payload
	ended bool
}

func (s *recordScanner) feed(b []byte) error {
	for len(b) > 0 {
		if s.ended {
			return errors.New("bytes after the end of the state stream")
		}
		if s.nh < 9 {
			c := copy(s.hdr[s.nh:], b)
			s.nh += c
			b = b[c:]
			if s.nh < 9 {
				return nil
			}
			s.left = binary.BigEndian.Uint64(s.hdr[1:])
			if s.hdr[0] == 'E' {
				if s.left > maxManifest {
					return fmt.Errorf("a state manifest of %d bytes", s.left)
				}
				s.end = make([]byte, 0, s.left)
			}
		}
		n := min(s.left, uint64(len(b)))
		if s.hdr[0] == 'E' {
			s.end = append(s.end, b[:n]...)
		}
		s.left -= n
		b = b[n:]
		if s.left == 0 {
			s.ended = s.hdr[0] == 'E'
			s.nh = 0
		}
	}
	return nil
}

// ImportState loads what ExportState wrote into this kernel's namespace,
// then reseeds random and numpy's global generator (a copy must not repeat
// its source's draws) and sets the execution count to the exported one.
// Variables that could not be loaded are in the manifest's NotSaved, with
// those the export could not save. If the stream itself is broken the
// error says so; the variables loaded before the break stay.
func (k *Kernel) ImportState(ctx context.Context, r io.Reader) (*StateManifest, error) {
	k.fresh.Store(false)
	if k.stateChannel {
		return k.importChannel(ctx, r)
	}
	send := func(write func([]byte) error) error {
		br := bufio.NewReaderSize(r, 1<<20)
		buf := make([]byte, 768<<10)
		line := make([]byte, 0, base64.StdEncoding.EncodedLen(len(buf))+16)
		for {
			n, rerr := io.ReadFull(br, buf)
			if n > 0 {
				line = append(line[:0], `{"chunk":"`...)
				line = base64.StdEncoding.AppendEncode(line, buf[:n])
				line = append(line, "\"}\n"...)
				if err := write(line); err != nil {
					return err
				}
			}
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				return write([]byte("{\"end\":true}\n"))
			}
			if rerr != nil {
				b, _ := json.Marshal(map[string]any{"end": true, "abort": rerr.Error()})
				return write(append(b, '\n'))
			}
			if err := ctx.Err(); err != nil {
				b, _ := json.Marshal(map[string]any{"end": true, "abort": err.Error()})
				return write(append(b, '\n'))
			}
		}
	}
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "import_state"}, sink: &replySink{typ: "import_state", tagged: true}, what: "an import of state", send: send,
		onReply: func(ev *wireEvent) {
			if ev.Reason == "" && ev.Manifest != nil {
				k.count = ev.Manifest.ExecutionCount
			}
		}})
	if err != nil {
		return nil, err
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("import state: %s", ev.Reason)
	}
	if ev.Manifest == nil {
		return nil, errors.New("import state: the kernel sent no manifest")
	}
	return ev.Manifest, nil
}

// ImportStateFile is ImportState from f, a state file (NewStateFile)
// holding a whole export. Sealed (SealStateFile) and given to a kernel
// with the state channel, f is not copied: the kernel maps it
// copy-on-write (MAP_PRIVATE) and loads the variables over that memory,
// so the large buffers (numpy arrays, pandas blocks) of every kernel given
// the same file share its pages until one writes to them, and a write
// stays in the writer's own copy. Otherwise f is read as ImportState reads.
// f is the caller's: it can be given to other kernels, and closed at any
// time after (the mappings keep what they need).
func (k *Kernel) ImportStateFile(ctx context.Context, f *os.File) (*StateManifest, error) {
	return k.ImportStateFiles(ctx, f, nil)
}

// ImportStateFiles is ImportStateFile of an export that refers to earlier
// state files (its manifest's Refs, StartExportOver): bases holds them,
// sealed, and the kernel maps them as it maps f.
func (k *Kernel) ImportStateFiles(ctx context.Context, f *os.File, bases []StateBase) (*StateManifest, error) {
	k.fresh.Store(false)
	if len(bases) > 0 {
		if !k.stateChannel || !sealedStateFile(f) {
			return nil, errors.New("import state: an export that refers to other state files needs the state channel and a sealed state file")
		}
		if len(bases) > MaxStateBases {
			return nil, fmt.Errorf("import state: %d state files it refers to: at most %d", len(bases), MaxStateBases)
		}
		for _, b := range bases {
			if !sealedStateFile(b.File) {
				return nil, fmt.Errorf("import state: state file %d is not sealed", b.Serial)
			}
		}
	}
	if !k.stateChannel || !sealedStateFile(f) {
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("import state: %w", err)
		}
		return k.ImportState(ctx, io.NewSectionReader(f, 0, fi.Size()))
	}
	var sendErr error
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "import_state", "channel": true}, sink: &replySink{typ: "import_state", tagged: true}, what: "an import of state",
		before: func(tag int64) {
			files, serials := baseFiles(bases)
			sendErr = k.p.sendFiles(tag, append([]*os.File{f}, files...), 1, serials)
		},
		onReply: func(ev *wireEvent) {
			if ev.Reason == "" && ev.Manifest != nil {
				k.count = ev.Manifest.ExecutionCount
			}
		}})
	if err != nil {
		return nil, err
	}
	if sendErr != nil {
		return nil, fmt.Errorf("import state: %w", sendErr)
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("import state: %s", ev.Reason)
	}
	if ev.Manifest == nil {
		return nil, errors.New("import state: the kernel sent no manifest")
	}
	return ev.Manifest, nil
}

// importChannel is ImportState on the state channel: the bytes go raw
// through a pipe the kernel reads as it loads them.
func (k *Kernel) importChannel(ctx context.Context, r io.Reader) (*StateManifest, error) {
	pr, pw, err := newStatePipe()
	if err != nil {
		return nil, fmt.Errorf("import state: %w", err)
	}
	defer pr.Close()
	copied := make(chan error, 1)
	go func() {
		// Large writes: each wakes the kernel's read once (io.Copy's
		// 32 KiB would wake it 32 times per MiB).
		_, err := io.CopyBuffer(struct{ io.Writer }{pw}, struct{ io.Reader }{r}, make([]byte, statePipeSize))
		pw.Close()
		copied <- err
	}()
	var sendErr error
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "import_state", "channel": true}, sink: &replySink{typ: "import_state", tagged: true}, what: "an import of state",
		before: func(tag int64) {
			sendErr = k.p.sendStream(tag, pr)
			pr.Close() // the kernel's now: its death ends our writes
		},
		onReply: func(ev *wireEvent) {
			if ev.Reason == "" && ev.Manifest != nil {
				k.count = ev.Manifest.ExecutionCount
			}
		}})
	pw.Close() // unblocks the copy if the kernel stopped reading
	cerr := <-copied
	if err != nil {
		return nil, err
	}
	if sendErr != nil {
		return nil, fmt.Errorf("import state: %w", sendErr)
	}
	if ev.Reason != "" {
		if cerr != nil && !errors.Is(cerr, os.ErrClosed) && !errors.Is(cerr, syscall.EPIPE) {
			return nil, fmt.Errorf("import state: read: %w (the kernel: %s)", cerr, ev.Reason)
		}
		return nil, fmt.Errorf("import state: %s", ev.Reason)
	}
	if ev.Manifest == nil {
		return nil, errors.New("import state: the kernel sent no manifest")
	}
	return ev.Manifest, nil
}

func (ev *wireEvent) info() *CheckpointInfo {
	return &CheckpointInfo{ID: ev.ID, ExecutionCount: ev.ExecutionCount, Threads: ev.Threads, Processes: ev.Processes}
}

func (ev *wireEvent) checkpointErr(id int) error {
	switch {
	case ev.Gone && ev.Why != "":
		return &LostError{ID: id, Why: ev.Why}
	case ev.Gone:
		return fmt.Errorf("checkpoint %d: %w", id, ErrCheckpointGone)
	case ev.Reason == fmt.Sprintf("no checkpoint %d", id):
		return fmt.Errorf("checkpoint %d: %w", id, ErrNoCheckpoint)
	case ev.Reason != "":
		return fmt.Errorf("checkpoint %d: %s", id, ev.Reason)
	}
	return nil
}

// stateDataPrefix starts the state_data lines kernel.py writes
// (_StateOut.flush), which parseStateData reads without a JSON decoder: a
// state is mostly these lines, megabytes each, and base64 has nothing to
// unescape.
var stateDataPrefix = []byte(`{"type":"state_data","tag":`)

// parseStateData fills ev from a state_data line of the exact form
// {"type":"state_data","tag":N,"chunk":"BASE64"} and reports whether it was one.
func parseStateData(line []byte, ev *wireEvent) bool {
	if !bytes.HasPrefix(line, stateDataPrefix) {
		return false
	}
	rest := line[len(stateDataPrefix):]
	i := bytes.IndexByte(rest, ',')
	if i < 0 {
		return false
	}
	tag, err := strconv.ParseInt(string(rest[:i]), 10, 64)
	if err != nil {
		return false
	}
	rest = rest[i:]
	const mid, end = `,"chunk":"`, `"}`
	if !bytes.HasPrefix(rest, []byte(mid)) || !bytes.HasSuffix(rest, []byte(end)) {
		return false
	}
	chunk := rest[len(mid) : len(rest)-len(end)]
	if bytes.ContainsAny(chunk, "\\\"") {
		return false // not plain base64: let the JSON decoder judge it
	}
	ev.Type = "state_data"
	ev.Tag = tag
	ev.chunk = chunk
	return true
}

// exportSink writes the state_data chunks to w and stops at the state_end.
type exportSink struct {
	w   io.Writer
	tag int64
	err error // the first write error; the stream is read to its end anyway
}

func (s *exportSink) text(int, string) {}
func (s *exportSink) setTag(t int64)   { s.tag = t }

func (s *exportSink) event(ev *wireEvent) bool {
	if ev.Tag != s.tag {
		return false // from an abandoned export
	}
	switch ev.Type {
	case "state_data":
		if s.err != nil {
			return false
		}
		chunk := ev.chunk
		if chunk == nil {
			chunk = []byte(ev.Chunk)
		}
		b := make([]byte, base64.StdEncoding.DecodedLen(len(chunk)))
		n, err := base64.StdEncoding.Decode(b, chunk)
		b = b[:n]
		if err != nil {
			s.err = fmt.Errorf("bad chunk from the kernel: %w", err)
			return false
		}
		_, s.err = s.w.Write(b)
		return false
	case "state_end":
		return true
	}
	return false
}

// lastEvent is a sink that keeps the event it stopped at.
type lastEvent struct {
	sink
	last *wireEvent
}

func (l *lastEvent) event(ev *wireEvent) bool {
	if l.sink.event(ev) {
		l.last = ev
		return true
	}
	return false
}

// call sends a request between cells and returns the kernel's reply of
// type typ; a kernel that does not answer within d is killed. onReply, if
// not nil, sees the reply while the caller still holds the pipes.
func (k *Kernel) call(ctx context.Context, req map[string]any, typ, what string, d time.Duration, onReply func(*wireEvent)) (*wireEvent, error) {
	return k.converse(ctx, conversation{req: req, sink: &replySink{typ: typ, tagged: true}, what: what, deadline: time.Now().Add(d), onReply: onReply})
}

// conversation is a request between cells and how to take its reply.
type conversation struct {
	req      map[string]any
	sink     sink   // what the kernel says goes here until it stops at an event
	what     string // names the request in errors
	deadline time.Time
	// send, if not nil, writes more request lines after req.
	send func(write func([]byte) error) error
	// before, if not nil, runs before req is written, with its tag.
	before  func(tag int64)
	onReply func(*wireEvent)
}

// converse holds the pipes for one conversation and returns the event the
// sink stopped at. A ctx done abandons it: the rest of the reply is skipped
// by the next reader. Past c.deadline the kernel is killed.
func (k *Kernel) converse(ctx context.Context, c conversation) (*wireEvent, error) {
	select {
	case k.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-k.sem }()
	if err := k.Err(); err != nil {
		return nil, err
	}
	// The tag tells this conversation's replies from those of one abandoned
	// earlier, which may still come.
	k.tag++
	c.req["tag"] = k.tag
	if t, ok := c.sink.(interface{ setTag(int64) }); ok {
		t.setTag(k.tag)
	}
	if c.before != nil {
		c.before(k.tag)
	}
	b, _ := json.Marshal(c.req)
	if err := k.p.writeRequest(append(b, '\n'), time.Now().Add(10*time.Second)); err != nil {
		k.Kill("could not write to the kernel: " + err.Error())
		return nil, k.Err()
	}
	l := &lastEvent{sink: c.sink}
	stopped := false
	if c.send != nil {
		// The kernel reads the lines as it loads them; a large value takes
		// it a while, hence the long bound on each write.
		err := c.send(func(line []byte) error {
			st, err := k.p.writeRequestListening(line, time.Now().Add(5*time.Minute), l)
			stopped = stopped || st
			return err
		})
		if err != nil {
			k.Kill("could not write to the kernel: " + err.Error())
			return nil, k.Err()
		}
	}
	stop := context.AfterFunc(ctx, k.p.wake)
	defer stop()
	for !stopped {
		wait := time.Duration(-1)
		if !c.deadline.IsZero() {
			wait = max(time.Until(c.deadline), 0)
		}
		st, err := k.p.step(wait, l)
		switch {
		case err != nil:
			k.Kill("protocol error: " + err.Error())
			return nil, k.Err()
		case st:
			stopped = true
		case k.p.eof[streamEvents] || k.hasExited():
			k.awaitExit(time.Second)
			return nil, k.Err()
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case !c.deadline.IsZero() && time.Now().After(c.deadline):
			k.Kill("the kernel did not answer " + c.what)
			return nil, k.Err()
		}
	}
	if c.onReply != nil {
		c.onReply(l.last)
	}
	return l.last, nil
}

// Remapped is what a RemapExport did.
type Remapped struct {
	// Bytes of the kernel's memory now mapped from the state file.
	Bytes int64
	// Skipped says why some were not ("" if all were): other threads
	// running, a buffer no longer in the kernel's own memory.
	Skipped string
	// Threads are the kernel's other threads, if they made it refuse.
	Threads []string
}

// RemapExport gives the kernel back f, the sealed state file of its own
// export (StartExportOver of the live kernel, waited for), with the
// ranges of that export's manifest (StateManifest.Remap, or a part of
// them): each run of whole pages inside those ranges whose bytes still
// equal the file's is replaced by a private (copy-on-write) mapping of
// the file, so that the kernel's next export proves those buffers
// unchanged by their pages rather than comparing their bytes, and the
// kernel's own copy of them is freed (the file's pages are the host's:
// see the package doc). Nothing the kernel holds changes value. It runs
// between cells, like any request; the kernel refuses it (Skipped) while
// other threads of its own run. The kernel compares what it maps: a
// hundred megabytes take tens of milliseconds, so callers give a few
// megabytes at a time.
func (k *Kernel) RemapExport(ctx context.Context, f *os.File, remap [][3]uint64) (*Remapped, error) {
	if !k.stateChannel || !sealedStateFile(f) {
		return nil, errors.New("remap an export: needs the state channel and a sealed state file")
	}
	var sendErr error
	ev, err := k.converse(ctx, conversation{req: map[string]any{"op": "remap_export", "remap": remap}, sink: &replySink{typ: "remap_export", tagged: true}, what: "a remap of an export",
		deadline: time.Now().Add(checkpointDeadline),
		before: func(tag int64) {
			sendErr = k.p.sendFiles(tag, []*os.File{f}, 0, nil)
		}})
	if err != nil {
		return nil, err
	}
	if sendErr != nil {
		return nil, fmt.Errorf("remap an export: %w", sendErr)
	}
	if ev.Reason != "" {
		return nil, fmt.Errorf("remap an export: %s", ev.Reason)
	}
	return &Remapped{Bytes: ev.Remapped, Skipped: ev.Skipped, Threads: ev.Threads}, nil
}
