#!/usr/bin/env bash
# Build the registry-free base images for durable-rollouts. Nothing is pulled from a registry:
# the OS comes from Debian's package mirror (debootstrap), Python packages from the host's pip.
#
#   docker/make-base-image.sh [--force] [--os-only] [--mirror URL]
#
# The Debian mirror is --mirror, else $ROLLOUTS_DEBIAN_MIRROR, else the one this machine's apt
# uses (the first `deb` source for a plain suite in /etc/apt/sources.list or the deb822 files
# /etc/apt/sources.list.d/*.sources); no mirror host is written in this repository.
#
# 1. OS image   ($ROLLOUTS_OS_IMAGE, default durable-rollouts-os:bookworm)
#    debootstrap --variant=minbase bookworm + python3 + python3-venv, made an image with
#    `docker import` (about 60 MB compressed on disk).
# 2. Base image ($ROLLOUTS_BASE_IMAGE, default durable-rollouts-base:latest)
#    FROM the OS image (docker/base.Dockerfile): a venv in /opt/venv holding this checkout's
#    package plus the libraries the env server needs ($ROLLOUTS_ENV_REQUIREMENTS), installed
#    offline from wheels the host's pip prepared, and the entry point `rollouts-env`.
#
# An image that already exists is kept unless --force is given, so CI and tests can call this
# script every time and pay for the build once per machine.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
os_image="${ROLLOUTS_OS_IMAGE:-durable-rollouts-os:bookworm}"
base_image="${ROLLOUTS_BASE_IMAGE:-durable-rollouts-base:latest}"
suite="${ROLLOUTS_DEBIAN_SUITE:-bookworm}"
mirror="${ROLLOUTS_DEBIAN_MIRROR:-}"
requirements="${ROLLOUTS_ENV_REQUIREMENTS:-pydantic>=2.10,<3}"
python="${PYTHON:-python3}"
force=0
os_only=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) force=1 ;;
    --os-only) os_only=1 ;;
    --mirror) [[ $# -ge 2 ]] || { echo "make-base-image.sh: --mirror needs a URL" >&2; exit 2; }
              mirror="$2"; shift ;;
    --mirror=*) mirror="${1#--mirror=}" ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "make-base-image.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

# The mirror apt already uses for the plain suite (not -security/-updates/-backports).
apt_mirror() {
  local line
  if [[ -f /etc/apt/sources.list ]]; then
    while read -r line; do
      # deb [options] URI SUITE COMPONENTS...
      set -- $line
      [[ "${1:-}" == deb ]] || continue
      shift
      [[ "${1:-}" == \[* ]] && while [[ $# -gt 0 && "$1" != *\] ]]; do shift; done && shift
      [[ $# -ge 2 && "$2" != *-* ]] && { echo "${1%/}"; return 0; }
    done < <(sed 's/#.*//' /etc/apt/sources.list)
  fi
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    # deb822 stanzas: Types / URIs / Suites, separated by blank lines
    awk 'BEGIN { RS=""; FS="\n" }
         { types=""; uris=""; suites=""
           for (i = 1; i <= NF; i++) {
             if ($i ~ /^Types:/) types=$i; if ($i ~ /^URIs:/) uris=$i; if ($i ~ /^Suites:/) suites=$i }
           if (types ~ /(^|[ \t])deb([ \t]|$)/ && suites ~ /:[ \t]*[a-z]+([ \t]|$)/) {
             sub(/^URIs:[ \t]*/, "", uris); split(uris, u, /[ \t]+/); sub(/\/$/, "", u[1]); print u[1]; exit } }' "$f" \
      | grep -m1 . && return 0
  done
  return 1
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if [[ $force == 1 ]] || ! have_image "$os_image"; then
  command -v debootstrap >/dev/null || { echo "make-base-image.sh: needs debootstrap (apt-get install -y debootstrap)" >&2; exit 2; }
  [[ -n "$mirror" ]] || mirror="$(apt_mirror)" || {
    echo "make-base-image.sh: no Debian mirror in /etc/apt; pass --mirror URL (or set ROLLOUTS_DEBIAN_MIRROR)" >&2; exit 2; }
  echo "==> Debian mirror: $mirror"
  root="$(mktemp -d /var/tmp/rollouts-rootfs.XXXXXX)"
  trap 'rm -rf "$root"' EXIT
  echo "==> debootstrap $suite into $root"
  debootstrap --variant=minbase --include=python3,python3-venv "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 40 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # Shrink: package caches, lists, docs and locales are not needed at run time.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
         "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
         "$root"/usr/share/locale/* "$root"/var/log/*
  echo "==> docker import -> $os_image"
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' - "$os_image" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi
[[ $os_only == 1 ]] && exit 0

if [[ $force == 1 ]] || ! have_image "$base_image"; then
  ctx="$(mktemp -d /var/tmp/rollouts-base-ctx.XXXXXX)"
  trap 'rm -rf "$ctx"' EXIT
  echo "==> wheels for the env server ($requirements) and this checkout"
  # The host's pip reaches the package index; the build container does not need to.
  # shellcheck disable=SC2086
  "$python" -m pip download -q --only-binary=:all: --dest "$ctx/wheels" $requirements
  "$python" -m pip wheel -q --no-deps --wheel-dir "$ctx/wheels" "$repo"
  cp "$here/base.Dockerfile" "$here/rollouts-env" "$ctx/"
  echo "==> docker build -> $base_image"
  DOCKER_BUILDKIT=0 docker build -q -f "$ctx/base.Dockerfile" --build-arg "OS_IMAGE=$os_image" \
    -t "$base_image" "$ctx" >/dev/null
  rm -rf "$ctx"
  trap - EXIT
fi
echo "$base_image"
