#!/usr/bin/env bash
# make image: builds the image deploy/Dockerfile describes without a
# container registry: a Debian 12 root made with mmdebstrap (the sandbox's
# Python and libraries from Debian's apt), sandloop's binary added, imported
# as localhost/sandloop:latest with `podman import` (Buildah and Podman
# share their image store). IMAGE_TAR=path also keeps the root as a tarball.
# Took 17 minutes here (2 shared cores, apt downloads included); 1.43 GB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
need=()
for t in mmdebstrap podman; do command -v "$t" >/dev/null || need+=("$t")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" crun uidmap
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
version="$(cd "$root" && git describe --tags --always --dirty 2>/dev/null || echo dev)"
(cd "$root" && CGO_ENABLED=0 go generate ./internal/jail && go generate ./internal/zygote &&
  CGO_ENABLED=0 go build -trimpath -ldflags "-X main.buildVersion=$version" -o "$work/sandloop" ./cmd/sandloop)
# The same packages as the Dockerfile's second stage (mmdebstrap, like
# --no-install-recommends, installs no recommends; the 1.4 GB come from
# Depends: matplotlib -> fonttools -> scipy -> pythran -> g++, boost), and
# the same user.
mmdebstrap --variant=apt --mode=auto --format=tar \
  --include=python3,python3-numpy,python3-pandas,python3-matplotlib,python3-flask,python3-requests,python3-pytest,python3-pil,ca-certificates \
  --customize-hook='mkdir -p "$1/usr/local/bin" "$1/var/lib/sandloop"' \
  --customize-hook='echo "sandloop:x:1000:1000:sandloop:/var/lib/sandloop:/usr/sbin/nologin" >>"$1/etc/passwd"' \
  --customize-hook='echo "sandloop:x:1000:" >>"$1/etc/group" && echo "sandloop:!:20000::::::" >>"$1/etc/shadow" && echo "sandloop:!::" >>"$1/etc/gshadow"' \
  --customize-hook='chown 1000:1000 "$1/var/lib/sandloop"' \
  --customize-hook="copy-in $work/sandloop /usr/local/bin" \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
  bookworm "$work/root.tar"
[ -z "${IMAGE_TAR:-}" ] || cp "$work/root.tar" "$IMAGE_TAR"
podman import \
  --change 'ENV XDG_DATA_HOME=/var/lib' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'EXPOSE 8080' \
  --change 'VOLUME /var/lib/sandloop' \
  --change 'ENTRYPOINT ["/usr/local/bin/sandloop"]' \
  --change 'CMD ["serve", "--addr", "0.0.0.0:8080"]' \
  "$work/root.tar" localhost/sandloop:latest
echo "image: localhost/sandloop:latest (podman images; docker: podman save localhost/sandloop | docker load)"
