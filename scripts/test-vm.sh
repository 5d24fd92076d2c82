#!/usr/bin/env bash
# make test-vm: the packages that touch the kernel (jail, session, zygote)
# on Debian 12's kernel (6.1) with cgroup v2 only, in a QEMU VM, as root and
# as an unprivileged user in a cgroup delegated to it (as systemd delegates
# user@UID.service). The test binaries are built here (natively, fast) and
# only run in the VM, which is slow (TCG emulation: ~10x). Each package's
# log is kept in out/vm/USER-PACKAGE.log.
#
#   --smoke       what `make test` runs: one boot, a few tests (cgroup v2
#                 delegation, OOM and pids limits, a scope from the real
#                 systemd, the zygote rootless, a session round trip) as
#                 root, ~2-3 minutes; skips (status 0,
#                 one line saying why) where there is no VM runner or QEMU.
#   SANDLOOP_VM   the VM runner (default: ../shared/vm/run.sh next to the
#                 clone, as on the project's build host); see its README.
#   VM_RUN        a -test.run pattern for every package (default: all);
#                 VM_RUN_jail, VM_RUN_session, VM_RUN_zygote: for one.
#   VM_SKIP       a -test.skip pattern for every package.
#   VM_PKGS       the packages (default: "jail session zygote").
#   VM_USERS      "root unprivileged" (default) or one of them.
#   VM_CONTAINER  1 (default; not in --smoke): also cmd/sandloop's
#                 TestInContainer as root: sandloop in a crun container
#                 (user namespace, the shipped seccomp profile) with the
#                 container's cgroup v2 group delegated to it (~10 min).
#                 0 skips it.
#   VM_CPU        QEMU's CPU model (default: max).
#   VM_TIMEOUT    seconds for the whole VM run, boot included (default: 3600).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
smoke="" short=""
if [ "${1:-}" = --smoke ]; then
  smoke=1
  # The smoke test's choice: delegation and the v2 limits (jail; a scope
  # from the real systemd), the zygote (root and rootless) and a session
  # round trip, in one boot.
  VM_PKGS="jail session zygote" VM_USERS=root VM_TIMEOUT=${VM_TIMEOUT:-600}
  VM_RUN_jail='^(TestCgroupV2Delegation|TestMemoryBombOOMKilled|TestForkBombStoppedByPidsLimit|TestRealSystemdScope)$'
  VM_RUN_session='^TestStatePersists$'
  VM_RUN_zygote='^(TestForkRuns|TestRootlessZygote)$'
  short=1 # (TestRootlessZygote runs fewer tests as the user)
fi
skip() {
  if [ -n "$smoke" ]; then
    echo "test-vm smoke: SKIPPED: $1 (make test-vm needs it)"
    exit 0
  fi
  echo "test-vm: $1" >&2
  exit 2
}
vm="${SANDLOOP_VM:-$root/../../shared/vm/run.sh}"
[ -x "$vm" ] || vm="$root/../shared/vm/run.sh"
[ -x "$vm" ] || skip "no VM runner at ../shared/vm/run.sh (set SANDLOOP_VM to shared/vm/run.sh)"
# What the VM runner needs here (idempotent; the smoke test only looks).
if ! command -v qemu-system-x86_64 >/dev/null; then
  [ -z "$smoke" ] || skip "QEMU (qemu-system-x86_64) is not installed"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends qemu-system-x86
fi
pkgs=${VM_PKGS:-jail session zygote}
users=${VM_USERS:-root unprivileged}
out="$root/out/vm"
[ -z "$smoke" ] || out="$root/out/vm-smoke"
rm -rf "$out"
mkdir -p "$out"
chmod 755 "$root/out" "$out"
for p in $pkgs; do
  (cd "$root" && CGO_ENABLED=0 go test -c -o "$out/$p.test" "./internal/$p")
done
container=""
if [ -z "$smoke" ] && [ "${VM_CONTAINER:-1}" != 0 ] && [[ " $users " == *" root "* ]]; then
  container=1
  (cd "$root" && CGO_ENABLED=0 go test -c -o "$out/container.test" ./cmd/sandloop)
fi
# The guest script: each package's binary in its own directory (as go test
# runs it), as root, then as uid 65534 in a group delegated to it. -test.v
# only for the counts.
{
  cat <<GUEST
#!/bin/sh
export TMPDIR=/tmp PATH=/usr/bin:/bin
cd "$root"
echo "vm: kernel \$(uname -r), \$(cat /proc/self/cgroup)"
status=0
# report USER PACKAGE STATUS START: one line of counts (and the log's end on failure)
report() {
  log="$out/\$1-\$2.log"
  verdict=ok; [ \$3 -eq 0 ] || { verdict=FAIL; status=1; }
  echo "vm: \$verdict \$1 \$2 (\$((\$(date +%s)-\$4))s): \$(grep -c '^ *--- PASS' "\$log") passed, \$(grep -c '^ *--- SKIP' "\$log") skipped, \$(grep -c '^ *--- FAIL' "\$log") failed"
  [ \$3 -eq 0 ] || tail -n 60 "\$log"
}
GUEST
  for user in $users; do
    for p in $pkgs; do
      run_var="VM_RUN_$p"
      pattern=${!run_var:-${VM_RUN:-}}
      args="-test.count=1 -test.v -test.timeout=20m${short:+ -test.short}${pattern:+ -test.run '$pattern'}${VM_SKIP:+ -test.skip '$VM_SKIP'}"
      echo "start=\$(date +%s)"
      if [ "$user" = root ]; then
        echo "(cd internal/$p && HOME=/tmp '$out/$p.test' $args) >'$out/$user-$p.log' 2>&1"
      else
        echo "g=/sys/fs/cgroup/user-65534-$p"
        echo "mkdir \$g && chown 65534:65534 \$g \$g/cgroup.procs \$g/cgroup.subtree_control \$g/cgroup.threads"
        # (\$\$ in a subshell is the script's PID: a shell of its own moves itself.)
        echo "(cd internal/$p && exec sh -c 'echo \$\$ >\"\$0/cgroup.procs\" && exec \"\$@\"' \$g setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp '$out/$p.test' $args) >'$out/$user-$p.log' 2>&1"
      fi
      echo "report $user $p \$? \$start"
    done
  done
  if [ -n "$container" ]; then
    # It builds sandloop and the jail's tests in the guest: Go, its caches
    # and its settings (the host's HOME, passed by the VM runner) are the
    # host's, copy-on-write.
    echo "start=\$(date +%s)"
    echo "(cd cmd/sandloop && PATH='$(dirname "$(command -v go)")':/usr/bin:/bin:/usr/sbin:/sbin GOCACHE='$(go env GOCACHE)' GOMODCACHE='$(go env GOMODCACHE)' '$out/container.test' -test.count=1 -test.v -test.timeout=50m -test.run '^TestInContainer\$') >'$out/root-container.log' 2>&1"
    echo "report root container \$? \$start"
  fi
  echo 'exit $status'
} >"$out/guest.sh"
chmod 755 "$out/guest.sh"
start=$(date +%s)
set +e
# The CPU model of a real host: under QEMU's default (qemu64, x86-64-v1)
# some of Debian's libraries the sessions import die with SIGILL.
export VM_CPU=${VM_CPU:-max}
"$vm" --timeout "${VM_TIMEOUT:-3600}" --share "$out" -- "$out/guest.sh"
rc=$?
echo "test-vm${smoke:+ smoke}: exit $rc after $(($(date +%s)-start))s (logs: $out)"
exit $rc
