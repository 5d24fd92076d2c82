package main

import (
	"fmt"
	"io"
	"time"
)

// waitIndicator shows "waiting for the model · 12s" on a terminal while a
// step waits for the model's answer, redrawn in place and cleared before
// anything else is printed. It is used only when stderr is a terminal: in a
// log file a line redrawn every second is noise.
type waitIndicator struct {
	w     io.Writer
	color bool
	stop  chan struct{} // closed to end the current wait
	done  chan struct{} // closed when the drawing goroutine has cleared its line
}

// waitFirstDraw keeps a quick answer from flashing an indicator.
const waitFirstDraw = 300 * time.Millisecond

// start shows the indicator, counting from since, with note after the time
// ("attempt 2/4" after a retry). The caller serializes start and clear.
func (wi *waitIndicator) start(since time.Time, note string) {
	wi.clear()
	wi.stop, wi.done = make(chan struct{}), make(chan struct{})
	go wi.draw(since, note, wi.stop, wi.done)
}

// clear removes the indicator, if shown, and returns once its line is gone.
func (wi *waitIndicator) clear() {
	if wi.stop == nil {
		return
	}
	close(wi.stop)
	<-wi.done
	wi.stop, wi.done = nil, nil
}

func (wi *waitIndicator) draw(since time.Time, note string, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(waitFirstDraw)
	defer t.Stop()
	shown := ""
	for {
		select {
		case <-stop:
			if shown != "" {
				fmt.Fprint(wi.w, "\r\x1b[K")
			}
			return
		case <-t.C:
		}
		s := "waiting for the model · " + elapsed(time.Since(since))
		if note != "" {
			s += " · " + note
		}
		if s != shown {
			if wi.color {
				fmt.Fprint(wi.w, "\r\x1b[K"+cDim+s+cReset)
			} else {
				fmt.Fprint(wi.w, "\r\x1b[K"+s)
			}
			shown = s
		}
		t.Reset(250 * time.Millisecond)
	}
}

// elapsed says a wait's length in whole seconds: "12s", "3m05s".
func elapsed(d time.Duration) string {
	s := int(d / time.Second)
	if s < 60 {
		return fmt.Sprintf("%ds", s)
	}
	return fmt.Sprintf("%dm%02ds", s/60, s%60)
}
