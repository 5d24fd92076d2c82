#!/usr/bin/env python3
"""Which of a zygote template's pages a forked kernel has its own copy of,
and what changed in them (internal/zygote's package doc, "Faults").

    scripts/cowdiff.py KERNEL_PID TEMPLATE_PID

Run as root while both live (e.g. a session's kernel after its first cell,
its PID from zygote.Process.HostPids, and the template's, Zygote.Pid). A page
counts as copied when it is present, anonymous and exclusive in the kernel
(/proc/PID/pagemap) and present in the template at the same address (a fork
has the template's layout); new pages are the kernel's own. The changed
words of each copied page are compared with the template's: a small change
of a word followed by a type pointer is taken for a reference count, and
the type's name read from the template.
"""
import collections, struct, sys

K, T = int(sys.argv[1]), int(sys.argv[2])
PAGE = 4096

def maps(pid):
    out = []
    for line in open(f"/proc/{pid}/maps"):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        out.append((lo, hi, f[1], f[5] if len(f) > 5 else ("anon" if f[4] == "0" else "?")))
    return out

def pm(pid):
    return open(f"/proc/{pid}/pagemap", "rb")

kpm, tpm = pm(K), pm(T)
kmem, tmem = open(f"/proc/{K}/mem", "rb"), open(f"/proc/{T}/mem", "rb")

def entry(f, addr):
    f.seek(addr // PAGE * 8)
    return struct.unpack("<Q", f.read(8))[0]

def read(f, addr, n):
    try:
        f.seek(addr); return f.read(n)
    except (OSError, ValueError, OverflowError):
        return None

tmaps = maps(T)
def tname(addr):
    for lo, hi, perm, name in tmaps:
        if lo <= addr < hi:
            return name
    return None

typename = {}
def tp_name(typ):
    if typ not in typename:
        nm = "?"
        b = read(tmem, typ + 24, 8)
        if b:
            p = struct.unpack("<Q", b)[0]
            s = read(tmem, p, 64)
            if s and b"\0" in s:
                nm = s.split(b"\0")[0].decode(errors="replace")
        typename[typ] = nm
    return typename[typ]

by_map = collections.Counter()
new_by_map = collections.Counter()
kinds = collections.Counter()
pagecls = collections.Counter()
nwords = collections.Counter()
page_first = collections.Counter()
total = 0
for lo, hi, perm, name in maps(K):
    if perm[1] != "w":
        continue
    for a in range(lo, hi, PAGE):
        e = entry(kpm, a)
        if not (e >> 63) & 1 or (e >> 61) & 1 or not (e >> 56) & 1:
            continue  # not present, file/shared, or not exclusive
        te = entry(tpm, a)
        if not (te >> 63) & 1:
            new_by_map[name] += 1
            continue
        total += 1
        by_map[name if name != "anon" else ("arena/anon")] += 1
        kp, tp = read(kmem, a, PAGE), read(tmem, a, PAGE)
        if kp is None or tp is None:
            continue
        seen = set()
        if name == "anon" or name == "[heap]":
            offs = [off for off in range(0, PAGE, 8) if kp[off:off+8] != tp[off:off+8]]
            pool = name == "anon" and (a % 16384 == 0) and any(o < 48 for o in offs)
            pagecls["pool header changed" if pool else ("<=2 words" if len(offs) <= 2 else ("<=8 words" if len(offs) <= 8 else ">8 words"))] += 1
            nwords[name] += len(offs)
        for off in range(0, PAGE, 8):
            kv, tv = struct.unpack_from("<q", kp, off)[0], struct.unpack_from("<q", tp, off)[0]
            if kv == tv:
                continue
            d = kv - tv
            if 0 < tv < 1 << 40 and abs(d) < 4096:
                typ = struct.unpack_from("<Q", tp, off + 8)[0] if off + 8 < PAGE else 0
                nm = tp_name(typ) if typ > 4096 else "?"
                kinds["refcnt " + nm] += 1
                seen.add("refcnt " + nm)
            else:
                kinds["other"] += 1
                seen.add("other")
        for s in seen:
            page_first[s] += 1
print(f"kernel {K} vs template {T}: {total} pages copied from the template's; new pages {sum(new_by_map.values())}")
print("copied pages by mapping:")
for k, v in by_map.most_common(25):
    print(f"  {v:5d} {k}")
print("new pages by mapping:")
for k, v in new_by_map.most_common(10):
    print(f"  {v:5d} {k}")
print("page classes (anon, heap):", dict(pagecls), "words changed:", dict(nwords))
print("changed words by kind (refcount-like: small delta, header's type):")
for k, v in kinds.most_common(40):
    print(f"  {v:6d} words, {page_first[k]:5d} pages: {k}")
