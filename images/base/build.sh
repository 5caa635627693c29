#!/usr/bin/env bash
# Bootstrap the offline base image (Debian bookworm minbase + python3, git, patch)
# with debootstrap when it does not exist yet. Idempotent: exits at once if the
# image is already present. Usage: images/base/build.sh [TAG]
set -euo pipefail
TAG="${1:-vf-sandbox/base:bookworm}"
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG already present"; exit 0
fi
command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; }
# Read the mirror from the machine's apt sources; never hard-code a registry host.
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$MIRROR" ] || { echo "no Debian mirror found in apt sources" >&2; exit 1; }
WORK=$(mktemp -d /tmp/vf-base.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "debootstrap bookworm from $MIRROR into $WORK (about a minute)"
debootstrap --variant=minbase \
  --include=python3,python3-venv,git,ca-certificates,patch,procps \
  bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
    tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
tar -C "$WORK/rootfs" -c . | docker import \
  -c 'CMD ["/bin/bash"]' -c 'ENV LANG=C.UTF-8' \
  -c 'LABEL vf-sandbox.recipe=base' - "$TAG" >/dev/null
echo "built $TAG"
