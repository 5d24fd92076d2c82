package kernel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// maxReads bounds the reads of one pipe per drain, so a flood on one pipe
// cannot starve the others.
const maxReads = 16

// outState is what was read from an output pipe and not yet passed on.
type outState struct {
	pend    []byte
	blocked int64 // stopped at this marker until its events are handled
}

// maxSeqDigits bounds a marker's sequence number; a longer candidate is
// output that happens to look like the start of a marker.
const maxSeqDigits = 19

// readBufs are the buffers pipes read into: shared, not one per kernel,
// so an idle session holds none (2,000 idle sessions held 125 MiB of them).
var readBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// pipes are our nonblocking ends of the kernel's pipes, plus an eventfd
// that wakes a poll for interrupts, cancellations and the kernel's exit.
type pipes struct {
	req    int
	fds    [3]int // events, stdout, stderr (read ends)
	wakeFD int
	state  int // our end of the state channel (statechan_linux.go)

	mu     sync.Mutex // guards wakeFD against close
	closed bool

	eof      [3]bool
	out      [3]outState // stdout and stderr
	prefix   []byte      // of markers: "\x1b]sl;TOKEN;"
	evBuf    []byte      // event bytes not yet handled
	evOff    int
	maxEvent int
	// lenient skips lines that are not events instead of failing (after
	// a take-over: the server before may have read half a line).
	lenient bool
}

// newPipes makes the kernel's pipes: ours nonblocking in p, theirs in files.
func newPipes(maxEvent int, token string) (p *pipes, files Files, err error) {
	p = &pipes{req: -1, fds: [3]int{-1, -1, -1}, wakeFD: -1, state: -1, maxEvent: maxEvent,
		prefix: []byte("\x1b]sl;" + token + ";")}
	var theirs [5]*os.File
	defer func() {
		if err != nil {
			p.close()
			for _, f := range theirs {
				if f != nil {
					f.Close()
				}
			}
		}
	}()
	mk := func(i int, name string, ourWrite bool) error {
		var fd [2]int
		if err := unix.Pipe2(fd[:], unix.O_CLOEXEC); err != nil {
			return fmt.Errorf("pipe: %w", err)
		}
		ours, their := fd[0], fd[1]
		if ourWrite {
			ours, their = fd[1], fd[0]
		}
		theirs[i] = os.NewFile(uintptr(their), name)
		if i == 0 {
			p.req = ours
		} else {
			p.fds[i-1] = ours
		}
		return unix.SetNonblock(ours, true)
	}
	if err = mk(0, "kernel-requests", true); err != nil {
		return
	}
	if err = mk(1, "kernel-events", false); err != nil {
		return
	}
	if err = mk(2, "kernel-stdout", false); err != nil {
		return
	}
	if err = mk(3, "kernel-stderr", false); err != nil {
		return
	}
	if p.wakeFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		err = fmt.Errorf("eventfd: %w", err)
		return
	}
	var sp [2]int
	if sp, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0); err != nil {
		err = fmt.Errorf("socketpair: %w", err)
		return
	}
	p.state, theirs[4] = sp[0], os.NewFile(uintptr(sp[1]), "kernel-state")
	if err = unix.SetNonblock(p.state, true); err != nil {
		return
	}
	files = Files{Requests: theirs[0], Events: theirs[1], Stdout: theirs[2], Stderr: theirs[3], State: theirs[4]}
	return p, files, nil
}

func (p *pipes) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	for _, fd := range append([]int{p.req, p.wakeFD, p.state}, p.fds[:]...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// handoff returns copies of our ends of the kernel's pipes, in the
// order of Files (requests, events, stdout, stderr, state), and the
// markers' token.
func (p *pipes) handoff() ([]*os.File, string, error) {
	var out []*os.File
	for i, fd := range []int{p.req, p.fds[0], p.fds[1], p.fds[2], p.state} {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			for _, f := range out {
				f.Close()
			}
			return nil, "", fmt.Errorf("dup the kernel's pipe %d: %w", i, err)
		}
		out = append(out, os.NewFile(uintptr(d), "kernel-pipe"))
	}
	token := string(p.prefix[len("\x1b]sl;") : len(p.prefix)-1])
	return out, token, nil
}

// attachPipes makes pipes of the ends handoff gave (it owns them from
// now on, closing them on failure).
func attachPipes(files []*os.File, maxEvent int, token string) (*pipes, error) {
	if len(files) != 5 {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("want the kernel's 5 pipes, got %d", len(files))
	}
	p := &pipes{req: -1, fds: [3]int{-1, -1, -1}, wakeFD: -1, state: -1, maxEvent: maxEvent,
		prefix: []byte("\x1b]sl;" + token + ";")}
	var fds [5]int
	for i, f := range files {
		// Our own descriptors: os.File would close them when collected.
		d, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		f.Close()
		if err != nil {
			for _, g := range files[i+1:] {
				g.Close()
			}
			for _, fd := range fds[:i] {
				unix.Close(fd)
			}
			return nil, err
		}
		fds[i] = d
	}
	p.req, p.fds, p.state = fds[0], [3]int{fds[1], fds[2], fds[3]}, fds[4]
	var err error
	for _, fd := range fds {
		if err == nil {
			err = unix.SetNonblock(fd, true)
		}
	}
	if err == nil {
		p.wakeFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// wake makes a poll in progress (or the next one) return.
func (p *pipes) wake() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(p.wakeFD, one[:])
}

func (p *pipes) allEOF() bool { return p.eof[0] && p.eof[1] && p.eof[2] }

// writeRequest writes one request line, waiting at most until deadline for
// room in the pipe.
func (p *pipes) writeRequest(b []byte, deadline time.Time) error {
	for len(b) > 0 {
		n, err := unix.Write(p.req, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			left := time.Until(deadline)
			if left <= 0 {
				return errors.New("the kernel does not read its requests")
			}
			fds := []unix.PollFd{{Fd: int32(p.req), Events: unix.POLLOUT}}
			if _, err := unix.Poll(fds, pollMillis(left)); err != nil && err != unix.EINTR {
				return err
			}
			continue
		case err != nil:
			return err
		}
		b = b[n:]
	}
	return nil
}

// writeRequestListening is writeRequest for long streams of requests (an
// import): while the pipe is full it hands what the kernel says meanwhile
// to s (output a loading value prints must not fill its pipe and stall the
// kernel), and reports whether s stopped at an event (an early reply).
func (p *pipes) writeRequestListening(b []byte, deadline time.Time, s sink) (stopped bool, err error) {
	for len(b) > 0 {
		n, err := unix.Write(p.req, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			left := time.Until(deadline)
			if left <= 0 {
				return stopped, errors.New("the kernel does not read its requests")
			}
			fds := []unix.PollFd{{Fd: int32(p.req), Events: unix.POLLOUT}}
			for i, fd := range p.fds {
				if !p.eof[i] {
					fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
				}
			}
			if _, err := unix.Poll(fds, pollMillis(min(left, time.Second))); err != nil && err != unix.EINTR {
				return stopped, err
			}
			if !stopped && fds[0].Revents == 0 {
				st, err := p.step(0, s)
				if err != nil {
					return stopped, err
				}
				stopped = st
			}
			if p.eof[streamEvents] {
				return stopped, errors.New("the kernel closed its event channel")
			}
			continue
		case err != nil:
			return stopped, err
		}
		b = b[n:]
	}
	return stopped, nil
}

func pollMillis(d time.Duration) int {
	if d < 0 {
		return -1
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

// step hands whatever the kernel has already said to s and, if nothing,
// waits up to timeout (negative: no limit) for it to say something or for
// a wake. It reports whether s stopped at an event.
func (p *pipes) step(timeout time.Duration, s sink) (bool, error) {
	// Event lines left over from an earlier call come first.
	if stop, err := p.handleLines(s); stop || err != nil {
		return stop, err
	}
	var pfd [4]unix.PollFd
	var which [4]int
	n := 0
	for i, fd := range p.fds {
		if !p.eof[i] {
			pfd[n] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
			which[n] = i
			n++
		}
	}
	pfd[n] = unix.PollFd{Fd: int32(p.wakeFD), Events: unix.POLLIN}
	which[n] = -1
	n++
	if _, err := unix.Poll(pfd[:n], pollMillis(timeout)); err != nil {
		if err == unix.EINTR {
			return false, nil
		}
		return false, fmt.Errorf("poll: %w", err)
	}
	readEvents := false
	for i := range n {
		if pfd[i].Revents == 0 {
			continue
		}
		switch which[i] {
		case -1:
			var b [8]byte
			unix.Read(p.wakeFD, b[:])
		case streamEvents:
			readEvents = true
		default:
			p.readOutput(which[i], s)
		}
	}
	if !readEvents {
		return false, nil
	}
	if err := p.readEvents(); err != nil {
		return false, err
	}
	return p.handleLines(s)
}

// readEvents appends what the event pipe holds to evBuf.
func (p *pipes) readEvents() error {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	rbuf := *bp
	for range maxReads {
		if p.evOff > 0 && p.evOff == len(p.evBuf) {
			p.evBuf, p.evOff = p.evBuf[:0], 0
		}
		n, err := unix.Read(p.fds[streamEvents], rbuf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return nil
		}
		if err != nil || n == 0 {
			p.eof[streamEvents] = true
			return nil
		}
		p.evBuf = append(p.evBuf, rbuf[:n]...)
		if len(p.evBuf)-p.evOff > p.maxEvent && bytes.IndexByte(p.evBuf[p.evOff:], '\n') < 0 {
			return fmt.Errorf("event longer than %d bytes", p.maxEvent)
		}
		if n < len(rbuf) {
			return nil // the pipe is empty
		}
	}
	return nil
}

// handleLines passes on the complete event lines in evBuf, each after the
// output written before it.
func (p *pipes) handleLines(s sink) (bool, error) {
	for p.evOff < len(p.evBuf) {
		rest := p.evBuf[p.evOff:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			if p.eof[streamEvents] {
				p.evOff = len(p.evBuf) // a partial last line from a dying kernel
			}
			break
		}
		line := rest[:i]
		p.evOff += i + 1
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev wireEvent
		if ok := parseStateData(line, &ev); !ok {
			if err := json.Unmarshal(line, &ev); err != nil || ev.Type == "" {
				if p.lenient {
					continue
				}
				return false, fmt.Errorf("not an event: %.80q", line)
			}
		}
		if ev.Seq > 0 {
			// A batch in the middle of a cell: the output before its
			// marker, the events, then the output after the marker.
			p.untilMarker(streamStdout, ev.Seq, s)
			p.untilMarker(streamStderr, ev.Seq, s)
			stop := s.event(&ev)
			for _, st := range [...]int{streamStdout, streamStderr} {
				if p.out[st].blocked == ev.Seq {
					p.out[st].blocked = 0
					p.pump(st, s, false)
				}
			}
			if stop {
				return true, nil
			}
			continue
		}
		// The last batch of a cell: all the output written before it.
		p.drainOutput(s)
		if s.event(&ev) {
			return true, nil
		}
	}
	if p.evOff == len(p.evBuf) {
		p.evBuf, p.evOff = p.evBuf[:0], 0
	}
	return false, nil
}

// drainOutput passes on all the output the pipes hold, markers or not
// (one poll when they are empty).
func (p *pipes) drainOutput(s sink) {
	var pfd [2]unix.PollFd
	n := 0
	for _, st := range [...]int{streamStdout, streamStderr} {
		if !p.eof[st] {
			pfd[n] = unix.PollFd{Fd: int32(p.fds[st]), Events: unix.POLLIN}
			n++
		}
	}
	if n > 0 {
		if got, err := unix.Poll(pfd[:n], 0); err != nil || got > 0 {
			p.fill(streamStdout)
			p.fill(streamStderr)
		}
	}
	p.pump(streamStdout, s, true)
	p.pump(streamStderr, s, true)
}

// untilMarker passes on the output of stream before marker seq. The kernel
// wrote the marker before the event, so it is in the pipe; if it is not (a
// forged event), nothing waits for it.
func (p *pipes) untilMarker(stream int, seq int64, s sink) {
	st := &p.out[stream]
	for st.blocked != seq {
		if st.blocked != 0 {
			st.blocked = 0 // a marker whose events never came
		}
		p.pump(stream, s, false)
		if st.blocked == seq || p.eof[stream] {
			return
		}
		if p.fill(stream) == 0 {
			return
		}
	}
}

// readOutput reads what an output pipe holds and passes it on up to the
// next marker.
func (p *pipes) readOutput(stream int, s sink) {
	p.fill(stream)
	p.pump(stream, s, false)
}

// fill appends what an output pipe holds to its pending bytes and returns
// how much it read.
func (p *pipes) fill(stream int) int {
	if p.eof[stream] {
		return 0
	}
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	rbuf := *bp
	total := 0
	for range maxReads {
		n, err := unix.Read(p.fds[stream], rbuf)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			break
		}
		if err != nil || n == 0 {
			p.eof[stream] = true
			break
		}
		total += n
		p.out[stream].pend = append(p.out[stream].pend, rbuf[:n]...)
		if n < len(rbuf) {
			break // the pipe is empty
		}
	}
	return total
}

// pump passes on the pending output of stream, stopping at a marker (it
// then waits for the marker's events) unless all, which passes everything
// on and drops markers.
func (p *pipes) pump(stream int, s sink, all bool) {
	st := &p.out[stream]
	if all {
		st.blocked = 0
	}
	final := all || p.eof[stream]
	b := st.pend
	for len(b) > 0 && st.blocked == 0 {
		i := bytes.Index(b, p.prefix)
		if i < 0 {
			cut := len(b)
			if !final {
				cut = runeBoundary(b[:cut-partialPrefix(b, p.prefix)])
			}
			if cut > 0 {
				s.text(stream, string(b[:cut]))
			}
			b = b[cut:]
			break
		}
		if i > 0 {
			s.text(stream, string(b[:i]))
		}
		rest := b[i+len(p.prefix):]
		j := bytes.IndexByte(rest, '\a')
		if j < 0 && len(rest) <= maxSeqDigits && !final {
			b = b[i:] // the rest of the marker is still on its way
			break
		}
		var seq int64
		var err error = errors.New("not a marker")
		if j >= 0 && j <= maxSeqDigits {
			seq, err = strconv.ParseInt(string(rest[:j]), 10, 64)
		}
		if err != nil || seq <= 0 {
			s.text(stream, string(b[i:i+len(p.prefix)])) // output that looks like a marker
			b = rest
			continue
		}
		b = rest[j+1:]
		if !all {
			st.blocked = seq
		}
	}
	st.pend = append(st.pend[:0], b...)
}

// partialPrefix returns the length of the longest suffix of b that is a
// proper prefix of prefix.
func partialPrefix(b, prefix []byte) int {
	for n := min(len(b), len(prefix)-1); n > 0; n-- {
		if bytes.Equal(b[len(b)-n:], prefix[:n]) {
			return n
		}
	}
	return 0
}

// closedPipes are the pipes of a kernel that has none (Gone).
func closedPipes() *pipes {
	return &pipes{req: -1, fds: [3]int{-1, -1, -1}, wakeFD: -1, state: -1, closed: true}
}
