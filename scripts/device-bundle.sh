#!/usr/bin/env bash
# device-bundle.sh DIR "LIBS" BIN... — put the CUDA-enabled binaries BIN... into DIR together
# with copies of the shared libraries named in LIBS (sonames, e.g. "libcjson.so.1") that the
# GPU machine does not have. The binaries carry the rpath $ORIGIN, so they find the copies
# beside them. Each library is located through ldd of the first binary that needs it.
# COMPACT=1 (make device-bundle COMPACT=1): each binary stripped of its symbols and compressed
# to NAME.xz (about a tenth of its size), for a transfer of limited size; scripts/gpu-moe.sh
# decompresses them where it runs.
set -eu
dir=$1; libs=$2; shift 2
compact=${COMPACT:-0}
case "$compact" in 0|1) ;; *) echo "device-bundle: COMPACT takes 0 or 1" >&2; exit 2;; esac
rm -rf "$dir"
mkdir -p "$dir"
for b in "$@"; do cp "$b" "$dir/"; done
for lib in $libs; do
  path=""
  for b in "$@"; do
    path=$(ldd "$b" | awk -v l="$lib" '$1 == l && $3 ~ /^\// {print $3; exit}')
    [ -n "$path" ] && break
  done
  if [ -z "$path" ]; then echo "device-bundle: no binary needs $lib (skipped)"; continue; fi
  cp -L "$path" "$dir/$lib"
done
if [ "$compact" = 1 ]; then
  for b in "$@"; do
    f="$dir/$(basename "$b")"
    strip "$f"
    xz -9 -f "$f"
  done
fi
echo "device bundle in $dir:"
ls -l "$dir" | tail -n +2
