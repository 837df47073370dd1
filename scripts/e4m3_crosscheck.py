#!/usr/bin/env python3
"""e4m3_crosscheck.py — tandem's float32 -> E4M3FN (torch semantics) and E2M1 encoders against
torch (CUDA and CPU) and ml_dtypes, on all 2^32 float32 bit patterns.

Run from the repository root on a machine with torch (CUDA), numpy, ml_dtypes and gcc:

    python3 scripts/e4m3_crosscheck.py [--log2 N] [--chunk-log2 C] [--no-torch-cpu] [--lib PATH]

tandem's side is core/formats.c itself, compiled here with gcc into a shared library together
with a small batch shim (written by this script; it enumerates the same bit patterns and
converts them on every core) and called through ctypes, chunk by chunk. Every output byte is
compared; nothing is hashed.

Checks (expected mismatches in brackets):
  e4m3 decode, 256 codes:  td_e4m3_to_f32 vs torch float8_e4m3fn -> float32 and ml_dtypes   [0]
  tandem TORCH vs torch CUDA  x.to(torch.float8_e4m3fn)                                      [0]
  tandem TORCH vs torch CPU   the same on the CPU (--no-torch-cpu skips it)                  [0]
  tandem TORCH vs ml_dtypes   x.astype(ml_dtypes.float8_e4m3fn)                              [0]
  tandem E2M1 (SIGNBIT rule) vs ml_dtypes float4_e2m1fn, non-NaN inputs                      [0]
  E2M1 on NaN inputs: reported, not judged (ml_dtypes gives 0x8 for +NaN and 0x0 for -NaN;
  tandem's non-failing encoder gives 0x7, as the PTX cvt does; the checked one rejects NaN)
--log2 N checks 2^N patterns spread evenly over the 2^32 (stride 2^(32-N)) instead of all.
The last thing printed is a table; the exit status is 0 when every judged count is 0.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

SHIM = r"""
#include "formats.h"
#include <pthread.h>
#include <stdint.h>
#include <string.h>

typedef struct job { uint64_t base, step; size_t b, e; int what, mode; uint8_t *out; } job;

static void *run(void *p)
{
    job *j = p;
    for (size_t i = j->b; i < j->e; i++) {
        uint32_t u = (uint32_t)(j->base + (uint64_t)i * j->step);
        float x;
        memcpy(&x, &u, 4);
        j->out[i] = j->what == 0 ? td_f32_to_e4m3(x, (td_e4m3_mode)j->mode)
                                 : td_e2m1_encode(x, (td_e2m1_sign)j->mode);
    }
    return NULL;
}

/* out[i] = encode(float32 with bits base + i*step), i < n; what 0: E4M3 in `mode`, 1: E2M1. */
int td_batch(uint64_t base, uint64_t step, size_t n, int what, int mode, uint8_t *out, int threads)
{
    pthread_t t[256];
    job jobs[256];
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    for (int k = 0; k < threads; k++) {
        jobs[k] = (job){base, step, n * (size_t)k / (size_t)threads, n * (size_t)(k + 1) / (size_t)threads,
                        what, mode, out};
        if (pthread_create(&t[k], NULL, run, &jobs[k])) return -1;
    }
    for (int k = 0; k < threads; k++) pthread_join(t[k], NULL);
    return 0;
}

void td_decode_all(float *out)
{
    for (int c = 0; c < 256; c++) out[c] = td_e4m3_to_f32((uint8_t)c);
}
"""


def build_lib(repo, path):
    d = tempfile.mkdtemp(prefix="td_e4m3_")
    shim = os.path.join(d, "shim.c")
    with open(shim, "w") as f:
        f.write(SHIM)
    cmd = ["gcc", "-O2", "-std=gnu11", "-shared", "-fPIC", "-ffp-contract=off", "-I" + os.path.join(repo, "core"),
           os.path.join(repo, "core", "formats.c"), os.path.join(repo, "core", "error.c"), shim,
           "-o", path, "-lpthread"]
    subprocess.run(cmd, check=True)
    return path


class Check:
    def __init__(self, name, judged=True):
        self.name, self.judged = name, judged
        self.inputs = self.mismatches = 0
        self.first = []  # (pattern, tandem, other)

    def add(self, patterns, mine, other, mask=None):
        if mask is not None:
            patterns, mine, other = patterns[mask], mine[mask], other[mask]
        self.inputs += len(mine)
        bad = np.flatnonzero(mine != other)
        self.mismatches += len(bad)
        for i in bad[: max(0, 4 - len(self.first))]:
            self.first.append((int(patterns[i]), int(mine[i]), int(other[i])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2", type=int, default=32, help="check 2^N patterns (default 32: all)")
    ap.add_argument("--chunk-log2", type=int, default=26, help="patterns per chunk (default 2^26)")
    ap.add_argument("--no-torch-cpu", action="store_true", help="skip the torch CPU comparison")
    ap.add_argument("--lib", default="/tmp/libtdfmt_e4m3.so", help="where to build the shared library")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()
    if not 8 <= a.log2 <= 32 or not 16 <= a.chunk_log2 <= 30:
        ap.error("--log2 in 8..32, --chunk-log2 in 16..30")

    import torch
    import ml_dtypes

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lib = ctypes.CDLL(build_lib(repo, a.lib))
    lib.td_batch.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                             ctypes.c_void_p, ctypes.c_int]
    lib.td_decode_all.argtypes = [ctypes.c_void_p]
    dev = "cuda" if torch.cuda.is_available() else None
    print(f"torch {torch.__version__} ({torch.cuda.get_device_name(0) if dev else 'no CUDA device'}), "
          f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, {a.threads} threads", flush=True)
    t0 = time.time()

    # decode of all 256 codes
    dec = Check("e4m3 decode: td vs torch / ml_dtypes")
    mine = np.zeros(256, np.float32)
    lib.td_decode_all(mine.ctypes.data)
    codes = np.arange(256, dtype=np.uint8)
    tv = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
    mv = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    for other in (tv, mv):
        same = (mine.view(np.uint32) == other.view(np.uint32)) | (np.isnan(mine) & np.isnan(other))
        dec.inputs += 256
        dec.mismatches += int((~same).sum())

    step = 1 << (32 - a.log2)
    total = 1 << a.log2
    chunk = min(1 << a.chunk_log2, total)
    c_cuda = Check("e4m3 TORCH vs torch CUDA .to(float8_e4m3fn)", judged=dev is not None)
    c_cpu = Check("e4m3 TORCH vs torch CPU .to(float8_e4m3fn)", judged=not a.no_torch_cpu)
    c_ml = Check("e4m3 TORCH vs ml_dtypes float8_e4m3fn")
    c_e2 = Check("e2m1 SIGNBIT vs ml_dtypes float4_e2m1fn (non-NaN)")
    c_e2n = Check("e2m1 on NaN inputs vs ml_dtypes (info)", judged=False)
    out8 = np.empty(chunk, np.uint8)
    out4 = np.empty(chunk, np.uint8)
    for k in range(0, total, chunk):
        base = k * step
        n = min(chunk, total - k)
        pats = np.arange(base, base + n * step, step, dtype=np.uint64).astype(np.uint32)
        x = pats.view(np.float32)
        lib.td_batch(base, step, n, 0, 0, out8.ctypes.data, a.threads)  # TD_E4M3_TORCH
        lib.td_batch(base, step, n, 1, 0, out4.ctypes.data, a.threads)  # TD_E2M1_SIGNBIT
        mine8, mine4 = out8[:n], out4[:n]
        if dev:
            v = torch.arange(base, base + n * step, step, dtype=torch.int64, device=dev)
            v = torch.where(v >= 2 ** 31, v - 2 ** 32, v).to(torch.int32).view(torch.float32)
            tc = v.to(torch.float8_e4m3fn).view(torch.uint8).cpu().numpy()
            c_cuda.add(pats, mine8, tc)
            del v
        if not a.no_torch_cpu:
            tcpu = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            c_cpu.add(pats, mine8, tcpu)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf/overflow inputs are the point
            ml8 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            ml4 = x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        c_ml.add(pats, mine8, ml8)
        nan = np.isnan(x)
        c_e2.add(pats, mine4, ml4, ~nan)
        if nan.any():
            c_e2n.add(pats, mine4, ml4, nan)
        done = k + n
        el = time.time() - t0
        tty = sys.stderr.isatty()
        if tty or done * 8 // total != k * 8 // total:
            print(f"{done}/{total} patterns, {el:.0f} s, ~{el * total / done - el:.0f} s left   ",
                  end="\r" if tty else "\n", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    checks = [dec, c_cuda, c_cpu, c_ml, c_e2, c_e2n]
    ok = True
    print(f"\n{'check':<52} {'inputs':>12} {'mismatches':>12} {'verdict':>8}  first mismatches (pattern: tandem / other)")
    for c in checks:
        if c.inputs == 0:
            verdict = "skipped"
        elif not c.judged:
            verdict = "info"
        else:
            verdict = "pass" if c.mismatches == 0 else "FAIL"
            ok = ok and c.mismatches == 0
        firsts = ", ".join(f"0x{p:08x}: 0x{m:02x}/0x{o:02x}" for p, m, o in c.first)
        print(f"{c.name:<52} {c.inputs:>12} {c.mismatches:>12} {verdict:>8}  {firsts}")
    print(f"\n{'all judged checks pass' if ok else 'MISMATCHES: see above'}; "
          f"{total} float32 patterns (stride {step}) in {time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
