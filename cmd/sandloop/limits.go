package main

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
	"github.com/sandloop/sandloop/internal/jail"
	"github.com/spf13/pflag"
)

// sizeValue is a byte count given as 512M, 1GiB, 1.5g or a plain number.
// A limit's takes 0 too, to refuse it with the limits' rule (limits).
type sizeValue struct {
	n     *int64
	limit bool
}

func (s sizeValue) String() string {
	if s.n == nil || *s.n == 0 {
		return ""
	}
	return strconv.FormatInt(*s.n, 10)
}
func (s sizeValue) Type() string { return "size" }
func (s sizeValue) Set(v string) error {
	if s.limit && strings.TrimSpace(v) == "0" {
		*s.n = 0
		return nil
	}
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s.n = n
	return nil
}

// parseSize reads sizes like "512M", "2GiB", "100k", "1.5G" or "1048576".
func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(v))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%q is not a size (use e.g. 512M or 2G)", v)
	}
	return int64(f * float64(mult)), nil
}

// limitFlags are the sandbox limits shared by run, exec and repl.
type limitFlags struct {
	timeout time.Duration
	memory  int64
	cpus    float64
	pids    int
	disk    int64
	files   int
	env     []string
	network bool
	allow   []string
	fs      *pflag.FlagSet
	// notes are said to the user before the run (a limit capped).
	notes []string
	// maxima: these are a server's --max- flags; prefix is what their
	// names start with ("max-").
	maxima bool
	prefix string
}

func (l *limitFlags) register(fs *pflag.FlagSet) {
	l.fs = fs
	fs.DurationVar(&l.timeout, "timeout", 0, "wall-clock limit, e.g. 30s or 5m (default: none)")
	fs.Var(sizeValue{n: &l.memory, limit: true}, "memory", "memory limit, swap included, e.g. 512M (default 512M)")
	fs.Float64Var(&l.cpus, "cpus", 0, "CPU quota in cores, e.g. 0.5, at most the host's CPUs (default 1)")
	fs.IntVar(&l.pids, "pids", 0, "maximum processes and threads of the program, sandloop's own not counted (at least 8; default 256)")
	l.registerQuota(fs, "", "")
	fs.StringArrayVar(&l.env, "env", nil, "environment variable K=V for the program (repeatable)")
	fs.BoolVar(&l.network, "network", false, "share the host's whole network, for trusted code (default: loopback only)")
	fs.StringSliceVar(&l.allow, "allow", nil, "let the sandbox reach only these through sandloop's proxy: host names (example.org, *.example.org, example.org:8443), addresses or ranges (private ones are refused unless listed), or presets ("+strings.Join(egress.PresetNames(), ", ")+"); repeatable or comma-separated")
}

// egressPolicy is the allowlist --allow asks for (nil: none).
func (l *limitFlags) egressPolicy() (*egress.Policy, error) {
	if len(l.allow) == 0 {
		return nil, nil
	}
	if l.network {
		return nil, usagef("--allow and --network exclude each other: --network shares the host's whole network, --allow only what it lists")
	}
	al, err := egress.ParseAllowlist(l.allow)
	if err != nil {
		return nil, usagef("--allow: %v", err)
	}
	if n := al.HostNote(); n != "" {
		l.notes = append(l.notes, "--allow: "+n)
	}
	return &egress.Policy{Allow: al}, nil
}

func (l *limitFlags) limits() (jail.Limits, error) {
	for _, kv := range l.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return jail.Limits{}, usagef("--env %q must be KEY=VALUE", kv)
		}
	}
	// One rule for every limit: a negative value, or a 0 given, is refused
	// ("not a limit"); below the minimum is refused with the minimum; above
	// what this host has is capped to it, with a note said at the start.
	f := func(name string) string { return "--" + l.prefix + name }
	for _, c := range []struct {
		name     string
		given    bool
		v, min   float64
		unit, df string
	}{
		{"timeout", false, l.timeout.Seconds(), 0, "", ""},
		{"cpus", l.set("cpus"), l.cpus, 0.01, "a number of cores such as 0.5", "1"},
		{"pids", l.set("pids"), float64(l.pids), 8, "a number of processes and threads", "256"},
		{"files", l.set("files"), float64(l.files), 16, "a number of files and directories", strconv.Itoa(jail.DefaultFiles)},
		{"disk", l.set("disk"), float64(l.disk), 1 << 20, "a size such as 256M", formatSize(jail.DefaultDisk)},
		{"memory", l.set("memory"), float64(l.memory), 16 << 20, "a size such as 512M", "512M"},
	} {
		switch {
		case c.v < 0:
			return jail.Limits{}, usagef("%s must not be negative", f(c.name))
		case c.given && c.v == 0:
			df := " " + c.df
			if l.prefix != "" {
				df = ": --" + c.name // a server's maximum defaults to its default
			}
			return jail.Limits{}, usagef("%s 0 is not a limit: give %s, at least %s (default%s)", f(c.name), c.unit, minText(c.name, c.min), df)
		case c.v != 0 && c.v < c.min:
			return jail.Limits{}, usagef("%s must be at least %s", f(c.name), minText(c.name, c.min))
		}
	}
	if n := float64(runtime.NumCPU()); l.cpus > n {
		l.notes = append(l.notes, fmt.Sprintf("%s %g is more than this host's %g CPUs: using %g", f("cpus"), l.cpus, n, n))
		l.cpus = n
	}
	if n := jail.MaxPids(); l.pids > n {
		l.notes = append(l.notes, fmt.Sprintf("%s %d is more than this host can run (kernel.pid_max): using %d", f("pids"), l.pids, n))
		l.pids = n
	}
	if n := jail.HostMemory(); n > 0 && l.memory > n {
		l.notes = append(l.notes, fmt.Sprintf("%s %s is more than this host's memory and swap: using %s", f("memory"), formatSize(l.memory), formatSize(n)))
		l.memory = n
	}
	lim := jail.Limits{Memory: l.memory, CPUs: l.cpus, Pids: l.pids, Timeout: l.timeout, Disk: l.disk, Files: l.files}
	if !l.maxima {
		// A server's maxima are checked with its defaults (serve).
		if err := checkDiskFits("--"+l.prefix, lim, jail.Limits{}); err != nil {
			return jail.Limits{}, err
		}
	}
	return lim, nil
}

// checkDiskFits refuses a workspace quota above the memory limit, naming
// the flags with prefix ("--" or "--max-"); a zero field of l is taken
// from fallback (a server's maxima default to its defaults), then from
// jail's defaults.
func checkDiskFits(prefix string, l, fallback jail.Limits) error {
	eff := jail.Limits{Memory: cmp.Or(l.Memory, fallback.Memory), Disk: cmp.Or(l.Disk, fallback.Disk)}.WithDefaults()
	if eff.DiskFits() == nil {
		return nil
	}
	return usagef("%sdisk %s is more than %smemory %s: %s; lower %sdisk or raise %smemory",
		prefix, formatSize(eff.Disk), prefix, formatSize(eff.Memory), jail.DiskOverMemoryWhy, prefix, prefix)
}

// registerQuota adds the workspace quota's flags, named with prefix
// ("max-" for a server's maxima) and described with what ("largest ...").
func (l *limitFlags) registerQuota(fs *pflag.FlagSet, prefix, what string) {
	l.fs, l.prefix = fs, prefix
	if what == "" {
		fs.Var(sizeValue{n: &l.disk, limit: true}, "disk", fmt.Sprintf("bytes the workspace may hold, enforced on every write (memory-backed: counts toward --memory, so at most --memory) (default %s, at most half of --memory)", formatSize(jail.DefaultDisk)))
		fs.IntVar(&l.files, "files", 0, fmt.Sprintf("files and directories the workspace may hold (default %d)", jail.DefaultFiles))
		return
	}
	l.maxima = true
	fs.Var(sizeValue{n: &l.disk, limit: true}, prefix+"disk", what+" workspace size a session may ask for (default: --disk)")
	fs.IntVar(&l.files, prefix+"files", 0, what+" workspace file count a session may ask for (default: --files)")
}

// set reports whether the user gave flag name (with the flags' prefix).
func (l *limitFlags) set(name string) bool { return l.fs != nil && l.fs.Changed(l.prefix+name) }

// minText is a limit's minimum as its flag takes it.
func minText(name string, min float64) string {
	if name == "disk" || name == "memory" {
		return formatSize(int64(min))
	}
	return strconv.FormatFloat(min, 'g', -1, 64)
}

// sayNotes prints the notes about the limits to w, once.
func (l *limitFlags) sayNotes(w io.Writer) {
	for _, n := range l.notes {
		fmt.Fprintln(w, "sandloop: note: "+n)
	}
	l.notes = nil
}

func (l *limitFlags) networkMode() jail.Network {
	if l.network {
		return jail.NetworkHost
	}
	return jail.NetworkNone
}
