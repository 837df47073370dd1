#!/usr/bin/env bash
# device-bundle.sh DIR "LIBS" BIN... — put the CUDA-enabled binaries BIN... into DIR together
# with copies of the shared libraries named in LIBS (sonames, e.g. "libcjson.so.1") that the
# GPU machine does not have. The binaries carry the rpath $ORIGIN, so they find the copies
# beside them. Each library is located through ldd of the first binary that needs it.
set -eu
dir=$1; libs=$2; shift 2
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
echo "device bundle in $dir:"
ls -l "$dir" | tail -n +2
