#!/usr/bin/env bash
# make test-vm: the packages that touch the kernel (jail, session, zygote)
# on Debian 12's kernel (6.1) with cgroup v2 only, in a QEMU VM, as root and
# as an unprivileged user in a cgroup delegated to it (as systemd delegates
# user@UID.service). The test binaries are built here (natively, fast) and
# only run in the VM, which is slow (TCG emulation: ~10x).
#
#   SANDLOOP_VM   the VM runner (default: ../shared/vm/run.sh next to the
#                 clone, as on the project's build host); see its README.
#   VM_RUN        a -test.run pattern for every package (default: all).
#   VM_SKIP       a -test.skip pattern for every package.
#   VM_PKGS       the packages (default: "jail session zygote").
#   VM_USERS      "root unprivileged" (default) or one of them.
#   VM_CPU        QEMU's CPU model (default: max).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
vm="${SANDLOOP_VM:-$root/../../shared/vm/run.sh}"
[ -x "$vm" ] || vm="$root/../shared/vm/run.sh"
if [ ! -x "$vm" ]; then
  echo "test-vm: no VM runner (set SANDLOOP_VM to shared/vm/run.sh)" >&2
  exit 2
fi
# What the VM runner needs here (idempotent).
if ! command -v qemu-system-x86_64 >/dev/null; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-system-x86
fi
pkgs=${VM_PKGS:-jail session zygote}
users=${VM_USERS:-root unprivileged}
out="$root/out/vm"
rm -rf "$out"
mkdir -p "$out"
chmod 755 "$root/out" "$out"
for p in $pkgs; do
  (cd "$root" && CGO_ENABLED=0 go test -c -o "$out/$p.test" "./internal/$p")
done
# The guest script: each package's binary in its own directory (as go test
# runs it), as root, then as uid 65534 in a group delegated to it.
cat >"$out/guest.sh" <<GUEST
#!/bin/sh
export TMPDIR=/tmp PATH=/usr/bin:/bin
cd "$root"
echo "vm: kernel \$(uname -r), \$(cat /proc/self/cgroup)"
status=0
for user in $users; do
  for p in $pkgs; do
    start=\$(date +%s)
    if [ "\$user" = root ]; then
      (cd internal/\$p && HOME=/tmp "$out/\$p.test" -test.count=1 -test.timeout=20m ${VM_RUN:+-test.run "$VM_RUN"} ${VM_SKIP:+-test.skip "$VM_SKIP"}) >"/tmp/\$user-\$p.log" 2>&1
    else
      g=/sys/fs/cgroup/user-65534-\$p
      mkdir \$g && chown 65534:65534 \$g \$g/cgroup.procs \$g/cgroup.subtree_control \$g/cgroup.threads
      (echo \$\$ >\$g/cgroup.procs && cd internal/\$p && exec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp "$out/\$p.test" -test.count=1 -test.timeout=20m ${VM_RUN:+-test.run "$VM_RUN"} ${VM_SKIP:+-test.skip "$VM_SKIP"}) >"/tmp/\$user-\$p.log" 2>&1
    fi
    rc=\$?
    [ \$rc -eq 0 ] || status=1
    verdict=ok; [ \$rc -eq 0 ] || verdict=FAIL
    echo "vm: \$verdict \$user \$p (\$((\$(date +%s)-start))s): \$(grep -c '^--- PASS\|^    --- PASS' /tmp/\$user-\$p.log) passed, \$(grep -c -- '--- SKIP' /tmp/\$user-\$p.log) skipped, \$(grep -c -- '--- FAIL' /tmp/\$user-\$p.log) failed"
    [ \$rc -eq 0 ] || tail -n 60 "/tmp/\$user-\$p.log"
  done
done
exit \$status
GUEST
chmod 755 "$out/guest.sh"
# -test.v only for the counts: the logs stay in the guest unless a package fails.
sed -i 's/-test.count=1/-test.count=1 -test.v/g' "$out/guest.sh"
start=$(date +%s)
set +e
# The CPU model of a real host: under QEMU's default (qemu64, x86-64-v1)
# some of Debian's libraries the sessions import die with SIGILL.
export VM_CPU=${VM_CPU:-max}
"$vm" --timeout "${VM_TIMEOUT:-3600}" -- "$out/guest.sh"
rc=$?
echo "test-vm: exit $rc after $(($(date +%s)-start))s"
exit $rc
