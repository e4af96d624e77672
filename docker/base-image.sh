#!/usr/bin/env bash
# Makes the base images docker/Dockerfile starts from, debian:bookworm and
# debian:bookworm-slim, out of Debian's archive when the engine does not have them (no
# image registry is reachable here): mmdebstrap --variant=minbase, then `docker import`.
#
#   docker/base-image.sh [--force]
#
# Idempotent and cached: an image the engine already has is left alone (--force remakes
# both), and the root filesystems are kept as tarballs in $PS_BASE_CACHE (default
# /var/cache/elastic-ps/base), so an engine whose images were pruned gets them back by an
# import, without downloading again. Needs root (mmdebstrap's root mode), mmdebstrap and
# a running engine; $DOCKER names the client (default: docker).
#
# The slim image is the minbase system with the path excludes of Debian's official
# bookworm-slim (manuals, documentation, locales): they stay in its dpkg configuration,
# so packages installed on top of it later leave those out too.
#
# Exit codes: 0 both images there, 1 failed (the message says why), 2 bad usage.
set -euo pipefail

DOCKER="${DOCKER:-docker}"
CACHE="${PS_BASE_CACHE:-/var/cache/elastic-ps/base}"
SUITE=bookworm
# The archive and suites of the images (their /etc/apt/sources.list): the release, its
# point updates and its security updates.
MIRRORS=(
  "deb http://deb.debian.org/debian $SUITE main"
  "deb http://deb.debian.org/debian $SUITE-updates main"
  "deb http://deb.debian.org/debian-security $SUITE-security main"
)
# As in Debian's official slim images: no manuals, documentation or translations (the
# copyright files stay).
SLIM_EXCLUDES=(
  "path-exclude=/usr/share/man/*"
  "path-exclude=/usr/share/doc/*"
  "path-include=/usr/share/doc/*/copyright"
  "path-exclude=/usr/share/info/*"
  "path-exclude=/usr/share/locale/*"
  "path-exclude=/usr/share/groff/*"
  "path-exclude=/usr/share/lintian/*"
  "path-exclude=/usr/share/linda/*"
)
# `docker import` keeps no environment; these make the images behave like the official ones.
CHANGES=(--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  --change 'CMD ["bash"]')

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "base-image: unknown argument $arg" >&2; exit 2 ;;
  esac
done

die() {
  echo "base-image: $*" >&2
  exit 1
}

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# make_rootfs NAME ARGS...: the tarball $CACHE/NAME.tar, made by mmdebstrap unless cached.
make_rootfs() {
  local name="$1" tar="$CACHE/$1.tar"
  shift
  if [ -s "$tar" ] && [ "$FORCE" = 0 ]; then return 0; fi
  command -v mmdebstrap >/dev/null || die "mmdebstrap is missing (apt-get install mmdebstrap)"
  [ "$(id -u)" = 0 ] || die "mmdebstrap needs root here (to make $name)"
  mkdir -p "$CACHE"
  echo "base-image: mmdebstrap --variant=minbase $SUITE -> $tar"
  local start=$SECONDS
  # A partial tarball never takes the name: mmdebstrap writes a temporary, renamed at the end.
  mmdebstrap --quiet --variant=minbase "$@" "$SUITE" "$tar.partial.tar" "${MIRRORS[@]}" ||
    { rm -f "$tar.partial.tar"; die "mmdebstrap failed for $name"; }
  mv "$tar.partial.tar" "$tar"
  echo "base-image: $name made in $((SECONDS - start)) s ($(du -h "$tar" | cut -f1))"
}

# import NAME TAG: docker import of $CACHE/NAME.tar as TAG, unless the engine has TAG.
import() {
  local name="$1" tag="$2"
  if have_image "$tag" && [ "$FORCE" = 0 ]; then
    echo "base-image: $tag is there"
    return 0
  fi
  make_rootfs "$name" "${@:3}"
  "$DOCKER" import "${CHANGES[@]}" "$CACHE/$name.tar" "$tag" >/dev/null ||
    die "docker import of $CACHE/$name.tar as $tag failed"
  echo "base-image: imported $tag"
}

"$DOCKER" version >/dev/null 2>&1 || die "no container engine answers ($DOCKER version failed)"
import bookworm-minbase "debian:$SUITE"
slim_opts=()
for e in "${SLIM_EXCLUDES[@]}"; do slim_opts+=(--dpkgopt="$e"); done
import bookworm-slim "debian:$SUITE-slim" "${slim_opts[@]}"
