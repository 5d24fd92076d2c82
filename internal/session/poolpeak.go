package session

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"slices"
	"time"
)

// The bursts the pool remembers (fairPool.peaks) are kept in
// ManagerOptions.PoolPeakFile, so that a server restarted within
// PoolPeakHold of a burst (an upgrade, a crash in the middle of an
// evaluation run) fills its pool for that burst at once, rather than
// serving the next one with kernels forked on demand. The file is written
// at most once a second while bursts come (peakSaveDelay) and when the
// manager closes; it is read once, by NewManager.

// peakSaveDelay coalesces the writes of PoolPeakFile: a sustained stream
// of creates changes the peaks at nearly every take.
const peakSaveDelay = time.Second

// peakFile is PoolPeakFile's content.
type peakFile struct {
	// Peaks are fairPool.peaks: the largest first, each later one
	// smaller and more recent.
	Peaks []peakEntry `json:"peaks"`
}

type peakEntry struct {
	Creates int       `json:"creates"` // within poolRateWindow
	At      time.Time `json:"at"`
}

// loadPeaks returns the peaks kept in PoolPeakFile that are still
// remembered now (none if there is no file, or it holds none), and what
// went wrong reading it, if anything did.
func (m *Manager) loadPeaks(now time.Time) ([]poolPeak, error) {
	b, err := os.ReadFile(m.opts.PoolPeakFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f peakFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, err
	}
	// Keep the order tookLocked keeps (oldest first; a later burst as
	// large replaces an earlier one), whatever the file's.
	slices.SortStableFunc(f.Peaks, func(a, b peakEntry) int { return a.At.Compare(b.At) })
	var peaks []poolPeak
	for _, e := range f.Peaks {
		age := now.Sub(e.At)
		if e.Creates <= 0 || age < 0 || age >= m.opts.PoolPeakHold {
			continue
		}
		for len(peaks) > 0 && peaks[len(peaks)-1].n <= e.Creates {
			peaks = peaks[:len(peaks)-1]
		}
		peaks = append(peaks, poolPeak{e.Creates, e.At})
	}
	return peaks, nil
}

// peaksChangedLocked arranges for the peaks to be written to PoolPeakFile
// within peakSaveDelay; m.mu is held.
func (m *Manager) peaksChangedLocked() {
	if m.opts.PoolPeakFile == "" || m.peakSave != nil || m.closed {
		return
	}
	m.peakSave = time.AfterFunc(peakSaveDelay, func() { m.savePeaks(false) })
}

// savePeaks writes the peaks to PoolPeakFile if a write is due; once the
// manager is closed, only for its Close (closing), which writes the one
// still due. A failure is logged: the pool works on without it, the next
// server starts without the memory.
func (m *Manager) savePeaks(closing bool) {
	// One write at a time, and a close waits for one under way (the
	// directory may be removed once the manager is closed).
	m.peakFileMu.Lock()
	defer m.peakFileMu.Unlock()
	m.mu.Lock()
	due := m.peakSave != nil
	if due {
		m.peakSave.Stop()
		m.peakSave = nil
	}
	if !due || (m.closed && !closing) {
		m.mu.Unlock()
		return
	}
	f := peakFile{Peaks: []peakEntry{}}
	for _, p := range m.fair.peaks {
		f.Peaks = append(f.Peaks, peakEntry{p.n, p.at.UTC()})
	}
	m.mu.Unlock()
	b, err := json.Marshal(f)
	if err == nil {
		err = writeFileAtomic(m.opts.PoolPeakFile, b)
	}
	if err != nil {
		m.log.Warn("the pool's remembered bursts are not kept for the next server", "err", err)
	}
}
