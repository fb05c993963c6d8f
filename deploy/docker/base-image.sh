#!/usr/bin/env bash
# Makes the local Debian base image when it is not there: debootstrap --variant=minbase from
# Debian's mirror, then `docker import`. No image hub is needed (none can be reached on the
# machines this project is built on). Usage: base-image.sh [TAG] (default fx-debian-base:bookworm).
set -euo pipefail
tag="${1:-fx-debian-base:bookworm}"
docker="${DOCKER:-docker}"
if "$docker" image inspect "$tag" >/dev/null 2>&1; then
  echo "base-image: $tag present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-image: debootstrap is not installed (make system-deps)" >&2; exit 1; }
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
dir="$(mktemp -d /tmp/fx-base.XXXXXX)"
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
tar -C "$dir" -c . | "$docker" import - "$tag" >/dev/null
rm -f "$dir.log"
echo "base-image: made $tag in $(( $(date +%s) - start )) s"
