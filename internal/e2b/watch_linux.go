package e2b

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"connectrpc.com/connect"
	"github.com/sandloop/sandloop/internal/workspace"
	"golang.org/x/sys/unix"
)

// dirWatcher follows a directory of a workspace (and, recursive, every
// directory under it) with inotify.
//
// Sandboxed code controls what the workspace holds, symlinks included, so
// a watch is never added by path: each directory is opened through the
// workspace (os.Root: never leading out of it, never a final symlink) and
// the watch added on that handle (/proc/self/fd/N names exactly the opened
// directory). A directory renamed or replaced meanwhile is at worst
// another directory of the same workspace.
type dirWatcher struct {
	ws        *workspace.Workspace
	root      string // the watched directory, relative to the workspace
	recursive bool
	maxDirs   int
	deliver   func(fsEvent) bool

	f    *os.File // the inotify instance (non-blocking: Close ends a Read)
	done chan struct{}

	movedFrom *move // a directory just moved away (run's goroutine only)

	mu     sync.Mutex
	dirs   map[int32]string // watch descriptor → directory relative to root ("" for root)
	endErr error
}

// move is a directory moved away, by the cookie of its IN_MOVED_FROM.
type move struct {
	cookie uint32
	name   string
}

// rename follows directory from, moved to to within the tree: its watches
// (on the directories themselves) hold, under their new names.
func (w *dirWatcher) rename(from, to string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, d := range w.dirs {
		if d == from {
			w.dirs[wd] = to
		} else if rest, ok := strings.CutPrefix(d, from+"/"); ok {
			w.dirs[wd] = to + "/" + rest
		}
	}
}

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR

// watchDir starts watching directory rel of ws. deliver gets each event on
// the watcher's goroutine and returns false to stop it.
func watchDir(ws *workspace.Workspace, rel string, recursive bool, maxDirs int, deliver func(fsEvent) bool) (*dirWatcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("this host has as many directory watchers as it may (fs.inotify.max_user_instances): stop one, or retry later"))
	}
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &dirWatcher{ws: ws, root: rel, recursive: recursive, maxDirs: maxDirs, deliver: deliver,
		f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), dirs: map[int32]string{}}
	if err := w.add("", false); err != nil {
		w.f.Close()
		if errors.Is(err, workspace.ErrNotDir) {
			return nil, connect.NewError(connect.CodeInvalidArgument, err)
		}
		return nil, err
	}
	go w.run()
	return w, nil
}

// add watches directory dir (relative to the watched one) and, when
// recursive, those under it; with report, what is found under it is
// reported as created (it was made before the watch could see it).
func (w *dirWatcher) add(dir string, report bool) error {
	f, err := w.watch(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return w.walk(dir, f, report)
}

// watch opens directory dir and adds its watch; the caller closes the
// directory.
func (w *dirWatcher) watch(dir string) (*os.File, error) {
	f, err := w.ws.OpenDir(joinRel(w.root, dir))
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	n := len(w.dirs)
	w.mu.Unlock()
	if n >= w.maxDirs {
		f.Close()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d directories to watch: watch a smaller tree", w.maxDirs))
	}
	var wd int
	err = w.control(func(fd int) error {
		var err error
		wd, err = unix.InotifyAddWatch(fd, "/proc/thread-self/fd/"+strconv.Itoa(int(f.Fd())), watchMask)
		return err
	})
	if err != nil {
		f.Close()
		if errors.Is(err, unix.ENOSPC) {
			return nil, connect.NewError(connect.CodeResourceExhausted, errors.New("this host watches as many directories as it may (fs.inotify.max_user_watches)"))
		}
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = dir
	w.mu.Unlock()
	return f, nil
}

// walk follows, when recursive, the directories under dir (open as f,
// watched already). Each is watched before it is reported: whoever sees
// a directory's creation and then writes in it is sure to see that too.
func (w *dirWatcher) walk(dir string, f *os.File, report bool) error {
	if !w.recursive {
		return nil
	}
	names, err := f.ReadDir(-1)
	if err != nil {
		return nil // removed meanwhile: its watch reports it
	}
	for _, de := range names {
		name := joinRel2(dir, de.Name())
		if de.Type()&fs.ModeType != fs.ModeDir {
			if report && !w.deliver(fsEvent{Name: name, Type: eventCreate}) {
				return errStopped
			}
			continue
		}
		sub, err := w.watch(name)
		if err != nil && !gone(err) {
			return err
		}
		if report && !w.deliver(fsEvent{Name: name, Type: eventCreate}) {
			if sub != nil {
				sub.Close()
			}
			return errStopped
		}
		if sub != nil {
			err = w.walk(name, sub, report)
			sub.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// gone says err is a directory's removal or replacement by another kind
// of file, meanwhile: nothing to watch, and its parent's watch reports it.
func gone(err error) bool {
	return errors.Is(err, workspace.ErrNotFound) || errors.Is(err, workspace.ErrNotDir)
}

// joinRel2 joins a name to a directory relative to the watched one ("" for it).
func joinRel2(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

var errStopped = errors.New("stopped")

// forget drops the watches of dir and of the directories under it (it
// was moved away: a move back in adds them again under their new names).
func (w *dirWatcher) forget(dir string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, d := range w.dirs {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			w.control(func(fd int) error {
				_, err := unix.InotifyRmWatch(fd, uint32(wd))
				return err
			})
			delete(w.dirs, wd)
		}
	}
}

// control runs fn on the inotify descriptor, unless it is closed (the
// descriptor cannot be closed, and reused, while fn runs; and w.f stays
// non-blocking, as Fd would not leave it).
func (w *dirWatcher) control(fn func(fd int) error) error {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// run reads events until the watcher is closed, the watched directory is
// gone or deliver says stop.
func (w *dirWatcher) run() {
	defer close(w.done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// No arrival came for the directory moved away: it left the
			// tree.
			w.f.SetReadDeadline(time.Time{})
			if p := w.movedFrom; p != nil {
				w.movedFrom = nil
				w.forget(p.name)
			}
			continue
		}
		if err != nil {
			return // closed
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if stop, err := w.handle(ev.Wd, ev.Mask, ev.Cookie, name); stop {
				w.end(err)
				return
			}
		}
		// The arrival of a moved directory comes right after its departure
		// (the kernel queues both in the rename), but this read may have
		// come between the two: it is waited for a moment before the
		// directory is taken as gone (a subtree forgotten and then added
		// again missed what was made in it meanwhile).
		if w.movedFrom != nil {
			w.f.SetReadDeadline(time.Now().Add(moveArrival))
		} else {
			w.f.SetReadDeadline(time.Time{})
		}
	}
}

// moveArrival is how long a directory moved away waits for its arrival in
// the tree (its IN_MOVED_TO) when a read ended between the two events.
const moveArrival = 200 * time.Millisecond

// handle turns one inotify event into the SDK's events (fsnotify's
// mapping, which envd uses) and follows new directories.
func (w *dirWatcher) handle(wd int32, mask, cookie uint32, name string) (stop bool, err error) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return true, errWatchOverflow
	}
	// A directory moved away is followed under its new name if the next
	// event is its arrival in the tree (the kernel queues the two
	// together), and forgotten otherwise.
	if p := w.movedFrom; p != nil && !(mask&unix.IN_MOVED_TO != 0 && cookie == p.cookie) {
		w.movedFrom = nil
		w.forget(p.name)
	}
	w.mu.Lock()
	dir, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
	}
	w.mu.Unlock()
	if !ok {
		return false, nil
	}
	if mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF) != 0 {
		// A directory under the watched one is reported by its parent; the
		// watched one itself ends the watch.
		return dir == "", nil
	}
	name = joinRel2(dir, name)
	isDir := mask&unix.IN_ISDIR != 0
	// A directory new to the tree is watched before its creation is
	// reported (see walk).
	var sub *os.File
	if w.recursive && isDir && mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && !(mask&unix.IN_MOVED_TO != 0 && w.movedFrom != nil) {
		var werr error
		sub, werr = w.watch(name)
		if werr != nil && !gone(werr) {
			return true, werr
		}
		if sub != nil {
			defer sub.Close()
		}
	}
	for _, op := range []struct {
		bits uint32
		t    eventType
	}{
		{unix.IN_CREATE | unix.IN_MOVED_TO, eventCreate},
		{unix.IN_MODIFY, eventWrite},
		{unix.IN_DELETE, eventRemove},
		{unix.IN_MOVED_FROM, eventRename},
		{unix.IN_ATTRIB, eventChmod},
	} {
		if mask&op.bits == 0 {
			continue
		}
		if !w.deliver(fsEvent{Name: name, Type: op.t}) {
			return true, nil
		}
	}
	if !w.recursive || !isDir {
		return false, nil
	}
	switch {
	case mask&unix.IN_MOVED_FROM != 0:
		w.movedFrom = &move{cookie, name}
	case mask&unix.IN_MOVED_TO != 0 && w.movedFrom != nil:
		w.rename(w.movedFrom.name, name)
		w.movedFrom = nil
	case sub != nil:
		// What a new directory got before its watch was added is
		// reported as created (a directory moved in held it before).
		if err := w.walk(name, sub, mask&unix.IN_CREATE != 0); err != nil {
			return true, noStop(err)
		}
	}
	return false, nil
}

// noStop is the error a watcher ends with for err (none when deliver
// stopped it).
func noStop(err error) error {
	if errors.Is(err, errStopped) {
		return nil
	}
	return err
}

func (w *dirWatcher) end(err error) {
	w.mu.Lock()
	w.endErr = err
	w.mu.Unlock()
}

// err is why the watcher ended on its own (nil: the watched directory is
// gone, or deliver stopped it).
func (w *dirWatcher) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.endErr
}

// close stops the watcher and waits for its goroutine.
func (w *dirWatcher) close() {
	w.f.Close()
	<-w.done
}
