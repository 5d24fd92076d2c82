#!/usr/bin/env python3
"""Split a system-wide profile of a bench/load run: CPU per session, by process
and by what each process was doing (docs/benchmarks.md, "Where a session's CPU
goes").

    perf record -a -g -F 249 -o perf.data -- ./load -mode sustain -old-duration=-1s
    scripts/perf-split.py perf.data load 3000 249

ROOT is the load binary's command name (the process holding the server and the
client); SESSIONS the sessions the run completed; HZ perf's -F. Processes are
told apart by the process tree perf recorded (its fork events): the zygote's
template is the descendant of ROOT with the most children, its children are
the spares' reapers, theirs the kernels. Kernel threads (kworkers, ksoftirqd,
RCU) are counted whole: on a busy machine part of their work is other programs'.
Each sample goes to the first of: the work item a kworker ran, the softirq, a
fork (copy_process), an address space's teardown (exit_mmap), the rest of an
exit, a page fault, a network namespace's setup, the cgroup mkdir/rmdir, or
else the outermost system call; "user" is user space.
"""
import collections
import re
import subprocess
import sys


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: perf-split.py PERF.DATA ROOT-COMMAND SESSIONS HZ")
    data, rootcomm, sessions, hz = sys.argv[1], sys.argv[2][:15], int(sys.argv[3]), float(sys.argv[4])
    if sessions <= 0 or hz <= 0:
        sys.exit("perf-split.py: SESSIONS and HZ must be positive")
    ms = 1000.0 / hz / sessions  # ms of CPU per session that one sample stands for

    parent, root = {}, None
    events = run(["perf", "script", "-i", data, "--show-task-events", "-F", "comm,pid,tid"])
    for line in events.splitlines():
        m = re.search(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)", line)
        if m and m[1] == m[2]:
            parent[int(m[1])] = int(m[3])
        m = re.search(r"PERF_RECORD_COMM(?: exec)?: (\S+):(\d+)/(\d+)", line)
        if m and m[1] == rootcomm and root is None:
            root = int(m[2])
    if root is None:
        sys.exit(f"perf-split.py: no process named {rootcomm!r} in {data}")

    memo = {}

    def ours(pid):
        if pid not in memo:
            p, n = pid, 0
            while p and p != root and n < 64:
                p, n = parent.get(p), n + 1
            memo[pid] = p == root
        return memo[pid]

    children = collections.Counter(parent.values())
    template = max((p for p in children if p != root and ours(p)), key=lambda p: children[p], default=None)

    def process(comm, pid):
        if pid == 0:
            return "idle"
        for prefix, name in (("kworker", "kworkers"), ("ksoftirqd", "ksoftirqd"), ("rcu", "RCU threads"), ("kthreadd", "kthreadd")):
            if comm.startswith(prefix):
                return name
        if not ours(pid):
            return "other programs"
        if pid == root:
            return "sandloop (Go: host and client)"
        if pid == template:
            return "python3 template"
        if parent.get(pid) == template:
            return "python3 reapers"
        if parent.get(parent.get(pid)) == template:
            return "python3 kernels"
        return "other processes of the run"

    syscall = re.compile(r"^(?:__x64_sys_|__do_sys_|__se_sys_)(\w+)")

    def activity(stack):
        syms = [s for _, s in stack]
        if not any(a.startswith("ffffffff") for a, _ in stack):
            return "user"
        for i, s in enumerate(syms):
            if s == "process_one_work" and i > 0:
                return "work " + syms[i - 1]
            if s in ("handle_softirqs", "__do_softirq") and i > 0:
                return "softirq " + syms[i - 1]
        for key, name in (("copy_process", "fork (copy_process)"), ("exit_mmap", "exit: address space (exit_mmap)"),
                          ("do_exit", "exit: the rest"), ("asm_exc_page_fault", "page faults"),
                          ("copy_net_ns", "network namespace setup"), ("cgroup_mkdir", "cgroup mkdir"),
                          ("cgroup_rmdir", "cgroup rmdir")):
            if key in syms:
                return name
        for s in reversed(syms):
            m = syscall.match(s)
            if m:
                return "syscall " + m[1]
        return "kernel (other)"

    by_process, by_activity = collections.Counter(), collections.Counter()
    total = 0
    for block in run(["perf", "script", "-i", data, "-F", "comm,pid,tid,ip,sym"]).split("\n\n"):
        lines = block.strip("\n").splitlines()
        m = re.match(r"\s*(.+?)\s+(\d+)/(\d+)", lines[0]) if lines else None
        if not m:
            continue
        stack = [tuple(l.split(None, 1)) for l in lines[1:] if len(l.split(None, 1)) == 2]
        p = process(m[1], int(m[2]))
        total += 1
        by_process[p] += 1
        if p != "idle":
            by_activity[(p, activity(stack))] += 1

    print(f"{total} samples ({total / hz:.1f} CPU-s), per session of {sessions}; root {rootcomm} (pid {root}), template pid {template}")
    print("| process | ms per session | share |\n|---|---|---|")
    for p, n in by_process.most_common():
        print(f"| {p} | {n * ms:.2f} | {100 * n / total:.1f}% |")
    print("\n| process | activity | ms per session |\n|---|---|---|")
    for (p, a), n in by_activity.most_common():
        if n * ms >= 0.02:
            print(f"| {p} | {a} | {n * ms:.2f} |")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"perf-split.py: {' '.join(cmd)}: {r.stderr.strip()}")
    return r.stdout


if __name__ == "__main__":
    main()
