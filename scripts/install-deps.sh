#!/usr/bin/env bash
# install-deps.sh — install the system packages tandem needs, only those missing.
#
# Idempotent and quiet when everything is present. Runs `apt-get update` only when a
# package cannot be installed from the current lists. Needs root (or sudo) only when
# something is actually missing.
#
#   scripts/install-deps.sh            install what is missing
#   scripts/install-deps.sh --check    exit 1 (listing them) if anything is missing
set -euo pipefail

PKGS=(libsqlite3-dev libcjson-dev libcmocka-dev pkg-config clang libclang-rt-dev make gcc procps xz-utils binutils)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "${1:-}" = "--check" ]; then
  echo "missing packages: ${missing[*]}" >&2
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing ${missing[*]} and apt-get is not available; install them by hand" >&2
  exit 1
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: missing ${missing[*]}; run as root to install them" >&2; exit 1; fi
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/tandem-apt.log 2>&1; then
  echo "install-deps: package lists may be stale; running apt-get update" >&2
  $SUDO apt-get update -q >>/tmp/tandem-apt.log 2>&1
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/tandem-apt.log 2>&1; then
    tail -20 /tmp/tandem-apt.log >&2
    echo "install-deps: apt-get install failed (log: /tmp/tandem-apt.log)" >&2
    exit 1
  fi
fi
echo "install-deps: done" >&2
