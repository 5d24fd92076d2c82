package snapshot

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// Locks are objects under locks/: "write-…" while a Write runs,
// "gc-…" while a collection sweeps. Each side writes its own lock, then
// lists the other side's: of a Write and a collection that overlap, at
// least one sees the other (storage with read-after-write consistency:
// a POSIX directory, S3 since 2020, SeaweedFS). The collection then gives
// up its turn, or the Write waits for the sweep to end.

// heldLock is a lock object, put again every LockTTL/4 while it is held
// so that others see it fresh; a lock not refreshed for LockTTL belongs to
// a process that died and is ignored.
type heldLock struct {
	s    *Store
	key  string
	stop chan struct{}
	done chan struct{}
	last atomic.Int64 // unix nanoseconds of the last successful put
}

func (s *Store) putLock(ctx context.Context, kind string) (*heldLock, error) {
	host, _ := os.Hostname()
	l := &heldLock{s: s, key: "locks/" + kind + "-" + strings.ToLower(rand.Text()[:16]), stop: make(chan struct{}), done: make(chan struct{})}
	put := func(ctx context.Context) error {
		body := fmt.Sprintf(`{"host":%q,"pid":%d,"at":%q}`, host, os.Getpid(), time.Now().UTC().Format(time.RFC3339Nano))
		t := time.Now()
		if err := s.b.Put(ctx, l.key, []byte(body)); err != nil {
			return err
		}
		l.last.Store(t.UnixNano())
		return nil
	}
	if err := put(ctx); err != nil {
		return nil, err
	}
	go func() {
		defer close(l.done)
		t := time.NewTicker(s.opts.LockTTL / 4)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
				if err := put(context.WithoutCancel(ctx)); err != nil {
					s.log.Warn("snapshot storage lock not refreshed", "key", l.key, "err", err)
				}
			}
		}
	}()
	return l, nil
}

// held reports whether others still see the lock fresh (it was refreshed
// within half its lifetime).
func (l *heldLock) held() bool {
	return time.Since(time.Unix(0, l.last.Load())) < l.s.opts.LockTTL/2
}

func (l *heldLock) release() {
	close(l.stop)
	<-l.done
	_ = l.s.b.Delete(context.Background(), l.key)
}

// fresh reports whether a lock of kind exists and is not stale.
func (s *Store) fresh(ctx context.Context, kind string) (bool, error) {
	found := false
	err := s.b.List(ctx, "locks/"+kind+"-", func(o ObjectInfo) error {
		if time.Since(o.ModTime) < s.opts.LockTTL {
			found = true
		}
		return nil
	})
	return found, err
}

// lockWrite takes a write lock, waiting while a collection sweeps.
func (s *Store) lockWrite(ctx context.Context) (*heldLock, error) {
	l, err := s.putLock(ctx, "write")
	if err != nil {
		return nil, err
	}
	for {
		busy, err := s.fresh(ctx, "gc")
		if err != nil {
			l.release()
			return nil, err
		}
		if !busy {
			return l, nil
		}
		select {
		case <-ctx.Done():
			l.release()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Collected says what a collection did.
type Collected struct {
	Skipped      bool // a Write was running: nothing was swept (try again later)
	Manifests    int  // read
	Blobs        int  // seen
	Deleted      int  // blobs deleted
	DeletedBytes int64
	Kept         int // unreferenced but younger than the collection: a Write may be about to reference them
}

// Collect deletes the blobs that no snapshot references (mark and sweep).
// It sweeps only while no Write runs (see the package doc), and keeps
// unreferenced blobs younger than its own start. A manifest that cannot
// be read stops it: its blobs might be swept otherwise.
func (s *Store) Collect(ctx context.Context) (*Collected, error) {
	res := &Collected{}
	start := time.Now()
	lock, err := s.putLock(ctx, "gc")
	if err != nil {
		return nil, err
	}
	defer lock.release()
	busy, err := s.fresh(ctx, "write")
	if err != nil {
		return nil, err
	}
	if busy {
		res.Skipped = true
		return res, nil
	}
	// Mark.
	live := map[string]bool{}
	err = s.b.List(ctx, "manifests/", func(o ObjectInfo) error {
		data, err := s.b.Get(ctx, o.Key, maxManifest)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // deleted meanwhile
			}
			return err
		}
		m, err := decodeManifest(strings.TrimSuffix(path.Base(o.Key), ".json"), o.Key, data)
		if err != nil {
			return fmt.Errorf("garbage collection stopped, nothing deleted: %w", err)
		}
		res.Manifests++
		m.eachChunk(func(c Chunk, _ string) { live[c.Hash] = true })
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Sweep.
	var dead []ObjectInfo
	err = s.b.List(ctx, "blobs/", func(o ObjectInfo) error {
		res.Blobs++
		if live[path.Base(o.Key)] {
			return nil
		}
		if !o.ModTime.Before(start) {
			res.Kept++
			return nil
		}
		dead = append(dead, o)
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, o := range dead {
		if !lock.held() {
			// Writers may no longer see this collection: stop sweeping.
			return res, fmt.Errorf("garbage collection stopped after %d blobs: its lock could not be refreshed", res.Deleted)
		}
		if err := s.b.Delete(ctx, o.Key); err != nil {
			return res, err
		}
		res.Deleted++
		res.DeletedBytes += o.Size
	}
	// Stale locks of crashed processes.
	_ = s.b.List(ctx, "locks/", func(o ObjectInfo) error {
		if time.Since(o.ModTime) > s.opts.LockTTL {
			_ = s.b.Delete(ctx, o.Key)
		}
		return nil
	})
	if d, ok := s.b.(*Dir); ok {
		d.cleanTmp(s.opts.LockTTL)
	}
	s.log.Info("snapshot garbage collection", "manifests", res.Manifests, "blobs", res.Blobs, "deleted", res.Deleted, "bytes", res.DeletedBytes)
	return res, nil
}

// Maintained says what Maintain did.
type Maintained struct {
	Expired   []string // ids of the snapshots deleted by retention
	Collected *Collected
}

// Maintain enforces retention over every owner's snapshots (older than
// Options.MaxAge; beyond the newest Options.MaxPerSession of one source
// session; held snapshots of hibernated sessions excepted, until
// Options.HeldMaxAge), then collects
// garbage. The host calls it periodically; now is
// the time retention is measured at.
func (s *Store) Maintain(ctx context.Context, now time.Time) (*Maintained, error) {
	res := &Maintained{}
	type ref struct {
		key, id, owner, session string
		at                      time.Time
		held                    bool
	}
	var all []ref
	err := s.b.List(ctx, "manifests/", func(o ObjectInfo) error {
		data, err := s.b.Get(ctx, o.Key, maxManifest)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		m, err := decodeManifest(strings.TrimSuffix(path.Base(o.Key), ".json"), o.Key, data)
		if err != nil {
			s.log.Warn("snapshot unreadable", "key", o.Key, "err", err)
			return nil
		}
		all = append(all, ref{o.Key, m.ID, m.Owner, m.Session, m.CreatedAt, m.Held})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.After(all[j].at) })
	perSession := map[[2]string]int{}
	for _, r := range all {
		if r.held {
			// A hibernated session's only copy; one that old lost its session.
			if s.opts.HeldMaxAge > 0 && now.Sub(r.at) > s.opts.HeldMaxAge {
				if err := s.b.Delete(ctx, r.key); err != nil {
					return res, err
				}
				res.Expired = append(res.Expired, r.id)
			}
			continue
		}
		expired := s.opts.MaxAge > 0 && now.Sub(r.at) > s.opts.MaxAge
		if s.opts.MaxPerSession > 0 && r.session != "" {
			k := [2]string{r.owner, r.session}
			perSession[k]++
			if perSession[k] > s.opts.MaxPerSession {
				expired = true
			}
		}
		if expired {
			if err := s.b.Delete(ctx, r.key); err != nil {
				return res, err
			}
			res.Expired = append(res.Expired, r.id)
		}
	}
	res.Collected, err = s.Collect(ctx)
	return res, err
}

// Usage is the compressed bytes of the distinct blobs that owner's
// snapshots reference (what Options.Quota bounds).
func (s *Store) Usage(ctx context.Context, owner string) (int64, error) {
	ms, err := s.List(ctx, owner)
	if err != nil {
		return 0, err
	}
	seen := map[string]int64{}
	for _, m := range ms {
		m.eachChunk(func(c Chunk, _ string) { seen[c.Hash] = c.Stored })
	}
	var n int64
	for _, b := range seen {
		n += b
	}
	return n, nil
}
