#!/usr/bin/env bash
# device-base.sh REV [NAME [PATCH]] — build the bench (bench/gpu/moe_decode) of commit REV,
# with PATCH applied to it if given, in a temporary detached worktree, and put it beside the
# device bundle as build/device/moe_decode_NAME.xz (NAME: base unless given), stripped and
# compressed the way `make device-bundle COMPACT=1` does, for the A/B sections of
# scripts/gpu-moe.sh (`ab` reads moe_decode_base and, where it is there, moe_decode_alt).
#
# Run it after `make device-bundle` (which empties build/device). The working tree is not
# touched: a change under test can stay uncommitted there while REV (e.g. HEAD) is its base.
#   scripts/device-base.sh HEAD                       # build/device/moe_decode_base.xz
#   scripts/device-base.sh HEAD alt my-change.patch   # build/device/moe_decode_alt.xz
# Environment: JOBS (default 2) for make -j; NVCC as make takes it.
set -eu
die() { echo "device-base: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 3 ] || die "usage: scripts/device-base.sh REV [NAME [PATCH]]"
rev=$1; name=${2:-base}; patch=${3:-}
case "$name" in ''|*[!a-z0-9_]*) die "NAME takes a-z, 0-9 and _ only (got '$name')";; esac
jobs=${JOBS:-2}
case "$jobs" in ''|*[!0-9]*) die "JOBS takes a whole number (got '$jobs')";; esac
root=$(git rev-parse --show-toplevel) || die "not inside a git checkout"
cd "$root"
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || die "no commit named '$rev'"
[ -d build/device ] || die "no build/device: run make device-bundle first"
if [ -n "$patch" ]; then
  [ -f "$patch" ] || die "no patch file '$patch'"
  patch=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
fi
wt=$(mktemp -d "${TMPDIR:-/tmp}/td-base.XXXXXX")
out=build/device/moe_decode_$name
cleanup() { rm -f "$wt.log" "$wt.bin" "$out.xz.tmp"; git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"; git worktree prune; }
trap cleanup EXIT
git worktree add --quiet --detach "$wt" "$commit"
if [ -n "$patch" ]; then
  (cd "$wt" && git apply "$patch") || die "patch '$patch' does not apply to $commit"
fi
echo "device-base: building bench/moe_decode of ${commit:0:12}${patch:+ with $(basename "$patch")} (about a minute)"
make -C "$wt" -j"$jobs" build/gpu/bench/moe_decode > "$wt.log" 2>&1 || {
  tail -20 "$wt.log" >&2; die "the build of ${commit:0:12} failed (its log's end above)"; }
strip -o "$wt.bin" "$wt/build/gpu/bench/moe_decode"
xz -9 -c "$wt.bin" > "$out.xz.tmp"
mv "$out.xz.tmp" "$out.xz"
chmod +x "$out.xz"
echo "device-base: $out.xz ($(stat -c %s "$out.xz") bytes) from ${commit:0:12}${patch:+ + $(basename "$patch")}"
