package session

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// noRemap, if set (by benchmarks: the baseline), leaves a session's
// buffers as they are after its forks' exports.
var noRemap atomic.Bool

// remapPiece bounds the bytes of one remap request: the session's turn
// is held that long (a comparison of those bytes and their mapping, a few
// milliseconds), so a cell waits at most for one piece.
const remapPiece = 4 << 20

// remapBefore, if set (by tests), is called before a session's remap
// starts: what it runs happens between the export and the remap.
var remapBefore func(*Session)

// remapHolding, if set (by tests), is called while a remap piece holds
// the session's turn, before the kernel's request; ctx ends with the run.
var remapHolding func(context.Context, *Session)

// remapState is a session's remaps under way (remapLater).
type remapState struct {
	last  atomic.Pointer[stateManifest] // the manifest of its last fork's export
	wg    sync.WaitGroup
	mu    sync.Mutex
	runs  map[*remapRun]struct{} // under way
	bytes atomic.Int64           // remapped so far, over the session's life
	took  atomic.Int64           // nanoseconds the kernel's turns took, over the session's life
}

// remapRun is one remapLater under way: stop ends it (a piece being
// mapped is finished first); done is closed when it has ended.
type remapRun struct {
	stop context.CancelFunc
	done chan struct{}
}

// stopRemaps ends the session's remaps under way and waits for them: a
// piece being mapped ends first (a few milliseconds), the rest is not
// tried (the next fork compares what stays anonymous). Pause and
// hibernation call it, so that a remap started by a fork a moment before
// does not hold the session's turn and make them refuse as if an
// execution ran.
func (s *Session) stopRemaps() {
	s.remap.mu.Lock()
	runs := make([]*remapRun, 0, len(s.remap.runs))
	for r := range s.remap.runs {
		r.stop()
		runs = append(runs, r)
	}
	s.remap.mu.Unlock()
	for _, r := range runs {
		<-r.done
	}
}

// remapLater gives the session's kernel back f, the sealed state file of
// an export of its live variables, with the export's manifest's ranges
// (kernel.RemapExport), after the fork that made it, in pieces, each
// under the session's turn: the session's large buffers become private
// mappings of the file wherever they still equal it, so that its next
// fork proves them unchanged by their pages, not by comparing 100 MB
// (see the package doc of internal/kernel, "Remapped exports"). f is the
// caller's copy, closed here. A paused, hibernated or closed session is
// left as it is.
func (s *Session) remapLater(f *os.File, remap [][3]uint64) {
	fi, err := f.Stat()
	if err != nil || !remapValid(remap, uint64(fi.Size())) {
		f.Close()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &remapRun{stop: cancel, done: make(chan struct{})}
	s.remap.mu.Lock()
	if s.remap.runs == nil {
		s.remap.runs = map[*remapRun]struct{}{}
	}
	s.remap.runs[run] = struct{}{}
	s.remap.mu.Unlock()
	s.remap.wg.Add(1)
	go func() {
		defer s.remap.wg.Done()
		defer close(run.done)
		defer func() {
			s.remap.mu.Lock()
			delete(s.remap.runs, run)
			s.remap.mu.Unlock()
		}()
		defer f.Close()
		defer cancel()
		if remapBefore != nil {
			remapBefore(s)
		}
		go func() { // a session closed meanwhile ends the wait for its turn
			select {
			case <-s.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		if !s.remapFits() {
			return
		}
		for _, piece := range remapPieces(remap, remapPiece) {
			if ctx.Err() != nil || !s.remapPiece(ctx, f, piece) {
				return
			}
		}
	}()
}

// remapFits says whether the session may have more of its memory mapped
// from its forks' state files. Those pages are the server's (it wrote the
// files), so they leave the session's memory charge: without a bound, a
// session forked again and again could fill its limit with new arrays
// after each remap and hold many times its limit. The bytes still mapped
// (those the last export proved unwritten by their pages) plus what the
// cgroup counts must be within the session's memory limit, so that what
// it holds stays within twice that limit: what it is charged, and at most
// as much again in pages of the files. Where no cgroup measures it
// (rlimits), RLIMIT_DATA counts such private writable mappings anyway.
func (s *Session) remapFits() bool {
	limit := s.opts.Limits.WithDefaults().Memory
	u, err := s.Resources()
	if limit <= 0 || err != nil {
		return true
	}
	var held int64
	if m := s.remap.last.Load(); m != nil {
		held = m.MappedBytes
	}
	if u.Memory+held > limit {
		s.log.Debug("remap skipped: the session's memory and its mapped state reach its limit", "session", s.id, "memory", u.Memory, "mapped", held, "limit", limit)
		return false
	}
	return true
}

// remapPiece remaps one piece under the session's turn; false if the
// rest should not be tried. ctx ends with the run (stopRemaps, or the
// session closed): while the turn is awaited, not while the kernel maps
// (a request it answers anyway, in a few milliseconds).
func (s *Session) remapPiece(ctx context.Context, f *os.File, piece [][3]uint64) bool {
	if err := s.acquire(ctx); err != nil {
		return false
	}
	defer s.release()
	if ctx.Err() != nil || s.State() != StateRunning {
		return false
	}
	if remapHolding != nil {
		remapHolding(ctx, s)
	}
	k, err := s.kernel()
	if err != nil || k.Err() != nil {
		return false
	}
	t0 := time.Now()
	r, err := k.RemapExport(context.WithoutCancel(ctx), f, piece)
	s.remap.took.Add(int64(time.Since(t0)))
	if err != nil {
		s.log.Debug("remap an export", "session", s.id, "err", err)
		return false
	}
	s.remap.bytes.Add(r.Bytes)
	return len(r.Threads) == 0 // the rest would be refused as well
}

// remapValid says whether ranges [address, offset, length] are what an
// export writes: buffers in a file of size bytes, one after another, none
// empty. The list comes from the kernel's copy (user code may have run
// there): anything else is not remapped at all.
func remapValid(remap [][3]uint64, size uint64) bool {
	var end uint64
	for _, r := range remap {
		off, n := r[1], r[2]
		if n == 0 || off < end || off > size || n > size-off {
			return false
		}
		end = off + n
	}
	return true
}

// remapPieces groups ranges [address, offset, length] into pieces of
// about max bytes: a range larger than max is cut at page boundaries of
// its address into parts of max (the last one up to twice that), smaller
// ones are never cut (a part shorter than the kernel's shortest run would
// not be remapped).
func remapPieces(remap [][3]uint64, max uint64) [][][3]uint64 {
	page := uint64(os.Getpagesize())
	var out [][][3]uint64
	var cur [][3]uint64
	var size uint64
	flush := func() {
		if len(cur) > 0 {
			out, cur, size = append(out, cur), nil, 0
		}
	}
	for _, r := range remap {
		addr, off, n := r[0], r[1], r[2]
		for n >= 2*max {
			take := (addr+max+page-1)/page*page - addr
			flush()
			out = append(out, [][3]uint64{{addr, off, take}})
			addr, off, n = addr+take, off+take, n-take
		}
		if size+n > max {
			flush()
		}
		cur = append(cur, [3]uint64{addr, off, n})
		size += n
	}
	flush()
	return out
}

// remapWait waits for the session's remaps under way to end.
func (s *Session) remapWait() { s.remap.wg.Wait() }
