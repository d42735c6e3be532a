#!/usr/bin/env bash
# Build the registry-free base images for durable-rollouts. Nothing is pulled from a registry:
# the OS comes from Debian's package mirror (debootstrap), Python packages from the host's pip.
#
#   docker/make-base-image.sh [--force] [--os-only]
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
mirror="${ROLLOUTS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
requirements="${ROLLOUTS_ENV_REQUIREMENTS:-pydantic>=2.10,<3}"
python="${PYTHON:-python3}"
force=0
os_only=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --os-only) os_only=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "make-base-image.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if [[ $force == 1 ]] || ! have_image "$os_image"; then
  command -v debootstrap >/dev/null || { echo "make-base-image.sh: needs debootstrap (apt-get install -y debootstrap)" >&2; exit 2; }
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
