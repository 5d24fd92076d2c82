package kernel

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// Measuring checkpoints from the host. kernel.py names each dormant copy
// "sl-cpN" (its comm; N the checkpoint's id), and a process can rename only
// itself: so the host, knowing the host PIDs the kernel runs under, finds
// the copies among their descendants and reads their memory without asking
// the kernel (which would wait for a running cell, and stall the next).
// A user's process that takes such a name is counted too: more, never less.

// ErrNoCopies: the kernel's processes cannot be found or read from the
// host (gone, or another user's): ask the kernel (CheckpointMemory).
var ErrNoCopies = errors.New("the kernel's processes cannot be read from the host")

// CopiesMemory reads, from the host, the private memory of each dormant
// checkpoint copy among the descendants of roots (smaps_rollup's
// Private_Clean+Private_Dirty, as CheckpointMemory), by checkpoint id. A
// copy not found (not yet named, just forked; or gone) is left out.
func CopiesMemory(roots []int) (map[int]int64, error) {
	mem := map[int]int64{}
	seen := map[int]bool{}
	queue := append([]int(nil), roots...)
	found := false
	for len(queue) > 0 && len(seen) < 1<<14 {
		pid := queue[0]
		queue = queue[1:]
		if pid <= 0 || seen[pid] {
			continue
		}
		seen[pid] = true
		dir := "/proc/" + strconv.Itoa(pid)
		tasks, err := os.ReadDir(dir + "/task")
		if err != nil {
			continue // gone
		}
		found = true
		for _, t := range tasks {
			b, _ := os.ReadFile(dir + "/task/" + t.Name() + "/children")
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					queue = append(queue, c)
				}
			}
		}
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil {
			continue
		}
		id, ok := strings.CutPrefix(strings.TrimSpace(string(comm)), "sl-cp")
		n, err := strconv.Atoi(id)
		if !ok || err != nil || n <= 0 {
			continue
		}
		m, err := smapsPrivate(dir + "/smaps_rollup")
		if errors.Is(err, fs.ErrPermission) {
			return nil, ErrNoCopies
		}
		if err != nil {
			continue // gone meanwhile
		}
		mem[n] += m // a user's process that took the name is counted too: more, never less
	}
	if !found {
		return nil, ErrNoCopies
	}
	return mem, nil
}

// smapsPrivate is Private_Clean+Private_Dirty of an smaps_rollup, in bytes.
func smapsPrivate(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var total int64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("Private_Clean:")) && !bytes.HasPrefix(line, []byte("Private_Dirty:")) {
			continue
		}
		f := bytes.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(string(f[1]), 10, 64)
		if err != nil {
			return 0, err
		}
		total += kb << 10
	}
	if len(b) == 0 {
		return 0, errors.New(path + ": empty")
	}
	return total, nil
}
