package session

import (
	"slices"
	"time"

	"github.com/sandloop/sandloop/internal/kernel"
)

// Measuring what checkpoints hold, off the request path.
//
// A checkpoint's kernel copy holds the pages it no longer shares with the
// live kernel (smaps_rollup's Private_Clean+Private_Dirty). Reading that
// walks the copy's page tables: 8-28 ms for two or three copies of a
// 100 MB kernel on a loaded machine. Done on every checkpoint, under the
// session's turn, it tripled a checkpoint's time. So the host reads the
// copies itself, in the background, each time the turn is given back
// while checkpoints are held (after a cell, a checkpoint, a restore): the
// kernel is not asked, the turn is not held, and by the next checkpoint
// at a human's or a model's pace the figure is of the memory as it is.
// The host finds the copies in the session's process tree by their name
// (kernel.CopiesMemory).
//
// The bound check (fit) sums those figures, with a generous estimate for
// a copy not yet measured; only when that sum may be over the bound, or
// the figures are older than what the kernel did since, does it measure
// exactly (by asking the kernel, under the turn it holds) before it drops
// or refuses a checkpoint. So the bound holds as before; only a session
// near its bound pays for the exact measure.

// measureOnRequest selects the former path (tests: the benchmark's
// baseline): measure by asking the kernel when the last figure is over
// measureEvery old, and nothing in the background.
var measureOnRequest = false

// newCopyEstimate is the least a copy not yet measured is counted as. A
// copy just forked holds the few pages it has touched since (well under
// a MiB): what it holds later comes from the live kernel's writes, which
// the measure after the cell sees.
const newCopyEstimate = 16 << 20

// hostRooted is a kernel process whose host PIDs the session knows: the
// roots of the process tree its checkpoint copies are in.
type hostRooted interface{ HostPids() []int }

func (j *jailProcess) HostPids() []int { return []int{j.p.Pid()} }

// measureLater starts a background measure of the checkpoint copies (or
// asks the running one to go again): called as the turn is given back,
// since what the copies hold changes only while someone holds it.
func (s *Session) measureLater() {
	if measureOnRequest {
		return
	}
	s.mu.Lock()
	p, _ := s.proc.(hostRooted)
	closed := s.closed
	s.mu.Unlock()
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.ContainsFunc(c.list, func(r *cpRecord) bool { return !r.Fresh }) || closed {
		return // no copy of the kernel to measure
	}
	// Figures older than this are stale, measured here or not: with no
	// background measure (no host PIDs known, or not readable from the
	// host) fit measures by asking the kernel, as before.
	c.released = time.Now()
	if p == nil || c.hostErr != nil {
		return
	}
	if c.bgDone != nil {
		c.bgAgain = true
		return
	}
	done := make(chan struct{})
	c.bgDone = done
	go s.measureInBackground(p.HostPids(), done)
}

func (s *Session) measureInBackground(roots []int, done chan struct{}) {
	c := &s.cps
	for tries := 0; ; tries++ {
		start := time.Now().UTC()
		mem, err := kernel.CopiesMemory(roots)
		c.mu.Lock()
		if err != nil {
			c.hostErr = err
			s.log.Debug("checkpoint copies not measured from the host: the kernel measures them", "err", err)
		}
		unnamed := false // a copy just forked may not have named itself yet
		for _, r := range c.list {
			if r.Fresh {
				continue // no copy of the kernel
			}
			m, ok := mem[r.kernelID]
			if ok && start.After(r.MemoryMeasuredAt) {
				r.MemoryBytes, r.MemoryMeasuredAt = m, start
			}
			unnamed = unnamed || !ok && time.Since(r.CreatedAt) < time.Second
		}
		if err == nil && (c.bgAgain || unnamed && tries < 20) {
			c.bgAgain = false
			c.mu.Unlock()
			if unnamed {
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		c.bgAgain, c.bgDone = false, nil
		close(done)
		c.mu.Unlock()
		return
	}
}

// estimateHeld is what the checkpoints hold by the latest figures (a copy
// not yet measured counted generously); whether some figure is older than
// the last time the turn was given back (stale); when the oldest figure
// was taken; and the running background measure if any.
func (s *Session) estimateHeld() (held int64, stale bool, oldest time.Time, running chan struct{}) {
	c := &s.cps
	c.mu.Lock()
	defer c.mu.Unlock()
	var most int64 = newCopyEstimate
	for _, r := range c.list {
		most = max(most, r.MemoryBytes)
	}
	for _, r := range c.list {
		switch {
		case r.Fresh: // no copy of the kernel
		case r.MemoryMeasuredAt.IsZero():
			held += most
			stale = stale || r.CreatedAt.Before(c.released)
		default:
			held += r.MemoryBytes
			stale = stale || r.MemoryMeasuredAt.Before(c.released)
			if oldest.IsZero() || r.MemoryMeasuredAt.Before(oldest) {
				oldest = r.MemoryMeasuredAt
			}
		}
	}
	if c.store != nil {
		held += c.store.HeldBytes()
	}
	return held, stale, oldest, c.bgDone
}
