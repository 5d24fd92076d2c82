#!/usr/bin/python3
"""Derives deploy/seccomp/sandloop.json from Docker's default seccomp profile.

usage: deploy/seccomp/derive.py DEFAULT_JSON > deploy/seccomp/sandloop.json

DEFAULT_JSON is profiles/seccomp/default.json of github.com/moby/profiles
(the profile Docker, Podman's containers-common and containerd ship). The
result is that profile, unchanged, plus one rule: the system calls sandloop's
jail needs to build its sandboxes (a user namespace, then mount, PID,
network, IPC, UTS and cgroup namespaces, a mount tree of its own, pivot_root)
allowed without CAP_SYS_ADMIN in the container. Docker's default allows most
of them only to containers that hold CAP_SYS_ADMIN, which sandloop does not
need (it gets its capabilities inside the user namespaces it creates), and
pivot_root to none. Each sandbox then loads sandloop's own, stricter filter
on top (internal/jail/seccomp_linux.go), so the user's code never gets these
calls.
"""
import json
import sys

JAIL = [
    "clone", "clone3", "unshare", "setns",
    "mount", "umount", "umount2", "pivot_root", "mount_setattr",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "sethostname", "setdomainname",
]

profile = json.load(open(sys.argv[1]))
kept = []
for rule in profile["syscalls"]:
    # Docker answers clone3 with ENOSYS without CAP_SYS_ADMIN (so that
    # programs fall back to clone, whose flags it can inspect): allowed here.
    if rule["names"] == ["clone3"] and rule["action"] == "SCMP_ACT_ERRNO":
        continue
    kept.append(rule)
kept.append({
    "names": JAIL,
    "action": "SCMP_ACT_ALLOW",
    "comment": "sandloop: namespaces and a mount tree for each sandbox, without CAP_SYS_ADMIN in the container",
})
profile["syscalls"] = kept
json.dump(profile, sys.stdout, indent="\t")
sys.stdout.write("\n")
