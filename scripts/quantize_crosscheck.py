#!/usr/bin/env python3
"""quantize_crosscheck.py — check `tandem quantize` output with the public safetensors library
and an independent torch dequantization, bit for bit.

Two steps (docs/gen-quantize.md, "GPU cross-check"):

  1. Here, where tandem is built (needs only Python 3 and the tandem binary):

       python3 scripts/quantize_crosscheck.py prepare build/xcheck-quant [--hf HFDIR]

     generates unquantized checkpoints with `tandem gen --unquantized` (qwen3-next-tiny
     per-expert, flash-next-tiny with fused 3-D experts), quantizes each with
     `tandem quantize --format modelopt` and `--format ct --dequant-manifest`, and runs
     `tandem inspect` on every output (--experts N makes smaller variants). With --hf HFDIR (the output of
     scripts/hf_tiny_checkpoints.py, i.e. checkpoints written by transformers
     save_pretrained) it also inspects and quantizes those. Each quantized checkpoint NAME is
     written to OUT/NAME/ with OUT/NAME.manifest.json beside it; the BF16 inputs are removed.

  2. On the machine with torch + safetensors (no tandem needed), copy OUT over and run:

       python3 scripts/quantize_crosscheck.py check build/xcheck-quant [--device cpu|cuda]

     For every OUT/NAME.manifest.json it opens OUT/NAME with safetensors.safe_open
     (framework "pt"), and for every NVFP4 tensor in the manifest:
       - checks the SHA-256 of the packed U8 and F8_E4M3 scale bytes as read by the library;
       - dequantizes with torch: scale bytes viewed as torch.float8_e4m3fn and widened to
         float32; nibbles unpacked low nibble = even column; E2M1 by a 16-entry table
         (code 8 is -0.0); then, in tandem's documented order,
           ModelOpt:           w = e2m1 * (scale.float() * weight_scale_2)
           compressed-tensors: w = e2m1 * (scale.float() / weight_global_scale)
         each product a float32 operation;
       - compares the SHA-256 of the float32 little-endian bytes (row-major [out, in]) with
         tandem's (td_nvfp4_dequantize) from the manifest, plus the global's bits and the
         first values.
     It prints one table row per checkpoint and exits 1 on any mismatch.

Nothing here is a dependency of tandem; torch is imported only by `check`.
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys

# ---- step 1: prepare (runs tandem) ---------------------------------------------------------

PRESETS = [
    # name, preset, extra gen flags
    ("qwen3-next-tiny", "qwen3-next-tiny", []),
    ("flash-next-tiny-fused", "flash-next-tiny", ["--fused-experts"]),
]


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = r.stdout.strip()
    if out:
        print("  " + out.replace("\n", "\n  "))
    return r.returncode, out


def prepare(args):
    tandem = args.tandem
    os.makedirs(args.out, exist_ok=True)
    sources = []
    for name, preset, extra in PRESETS:
        src = os.path.join(args.out, name + "-bf16")
        experts = ["--experts", str(args.experts)] if args.experts else []
        rc, _ = run([tandem, "gen", "--preset", preset, "--unquantized", "--seed", str(args.seed),
                     "--out", src, "--force", "--no-progress"] + experts + extra)
        if rc:
            sys.exit("prepare: tandem gen failed")
        sources.append((name, src, True))
    if args.hf:
        for model in sorted(os.listdir(args.hf)):
            d = os.path.join(args.hf, model)
            if os.path.isdir(d) and os.path.exists(os.path.join(d, "config.json")):
                rc, _ = run([tandem, "inspect", "--model", d, "--no-progress"])
                if rc:
                    sys.exit("prepare: tandem inspect rejected the transformers checkpoint " + d)
                sources.append(("hf-" + model, d, False))
    failures = 0
    for name, src, generated in sources:
        for fmt in ("modelopt", "ct"):
            out = os.path.join(args.out, "%s-%s" % (name, fmt))
            manifest = out + ".manifest.json"
            rc, _ = run([tandem, "quantize", "--in", src, "--out", out, "--format", fmt, "--force",
                         "--no-progress", "--dequant-manifest", manifest])
            if rc:
                failures += 1
                continue
            rc, _ = run([tandem, "inspect", "--model", out, "--no-progress"])
            failures += rc != 0
        if generated and not args.keep_inputs:
            shutil.rmtree(src)
    print("\nprepare: %d failure(s); copy %s to the torch machine and run `check`" % (failures, args.out))
    sys.exit(1 if failures else 0)


# ---- step 2: check (runs torch) -----------------------------------------------------------

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def f32_bits(x):
    return "0x%08x" % struct.unpack("<I", struct.pack("<f", x))[0]


class Shards:
    """Lazily opened safe_open handles of one checkpoint."""

    def __init__(self, directory, safe_open):
        self.dir = directory
        self.safe_open = safe_open
        self.handles = {}

    def get(self, shard, name):
        if shard not in self.handles:
            self.handles[shard] = self.safe_open(os.path.join(self.dir, shard), framework="pt", device="cpu")
        return self.handles[shard].get_tensor(name)


def tensor_bytes(t, torch):
    """Raw bytes of a tensor as stored (uint8 view, C order)."""
    t = t.contiguous()
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    return t.numpy().tobytes()


def dequantize(packed, scale, glob, fmt, device, torch):
    rows, half = packed.shape
    cols = half * 2
    p = packed.to(device)
    codes = torch.stack((p & 0x0F, p >> 4), dim=-1).reshape(rows, cols).long()
    table = torch.tensor(E2M1, dtype=torch.float32, device=device)
    e2m1 = table[codes]
    s = scale.to(device).to(torch.float32)           # float8_e4m3fn -> float32, exact
    g = glob.to(device).to(torch.float32).reshape(())
    factor = s * g if fmt == "modelopt" else s / g   # one float32 rounding per block
    factor = factor.repeat_interleave(16, dim=1)
    return (e2m1 * factor).cpu()                     # one float32 rounding per element


def check_one(manifest_path, device, torch, safe_open):
    with open(manifest_path) as f:
        m = json.load(f)
    ckpt = manifest_path[: -len(".manifest.json")]
    fmt = m["format"]
    fmt = "modelopt" if fmt == "modelopt" else "ct"
    sh = Shards(ckpt, safe_open)
    stats = {"tensors": 0, "packed": 0, "scale": 0, "global": 0, "dequant": 0, "first": 0}
    bad = []
    for e in m["tensors"]:
        stats["tensors"] += 1
        packed = sh.get(e["shard"], e["weight"])
        scale = sh.get(e["shard"], e["scale"])
        glob = sh.get(e["shard"], e["global"])
        if packed.dtype != torch.uint8 or scale.dtype != torch.float8_e4m3fn or glob.dtype != torch.float32:
            bad.append("%s: dtypes %s/%s/%s" % (e["module"], packed.dtype, scale.dtype, glob.dtype))
            continue
        rows, cols = e["shape"]
        if tuple(packed.shape) != (rows, cols // 2) or tuple(scale.shape) != (rows, cols // 16):
            bad.append("%s: shapes %s/%s" % (e["module"], tuple(packed.shape), tuple(scale.shape)))
            continue
        ok_p = hashlib.sha256(tensor_bytes(packed, torch)).hexdigest() == e["sha256_packed"]
        ok_s = hashlib.sha256(tensor_bytes(scale, torch)).hexdigest() == e["sha256_scale"]
        ok_g = f32_bits(float(glob.reshape(()))) == e["global_bits"]
        w = dequantize(packed, scale, glob, fmt, device, torch)
        raw = w.contiguous().numpy().astype("<f4", copy=False).tobytes()
        ok_d = hashlib.sha256(raw).hexdigest() == e["sha256_dequant_f32le"]
        first = [f32_bits(float(v)) for v in w.reshape(-1)[: len(e["first_f32_bits"])]]
        ok_f = first == e["first_f32_bits"]
        for k, ok in (("packed", ok_p), ("scale", ok_s), ("global", ok_g), ("dequant", ok_d), ("first", ok_f)):
            stats[k] += ok
        if not (ok_p and ok_s and ok_g and ok_d and ok_f):
            bad.append("%s: packed %s scale %s global %s dequant %s first %s (torch %s vs tandem %s)" % (
                e["module"], ok_p, ok_s, ok_g, ok_d, ok_f, first[:3], e["first_f32_bits"][:3]))
    return os.path.basename(ckpt), m["format"], stats, bad


def check(args):
    import torch
    import safetensors
    from safetensors import safe_open

    print("torch %s, safetensors %s, device %s" % (torch.__version__, safetensors.__version__, args.device))
    manifests = sorted(f for f in os.listdir(args.dir) if f.endswith(".manifest.json"))
    if not manifests:
        sys.exit("check: no *.manifest.json in %s (run `prepare` first)" % args.dir)
    rows, failures = [], 0
    for mf in manifests:
        name, fmt, st, bad = check_one(os.path.join(args.dir, mf), args.device, torch, safe_open)
        n = st["tensors"]
        ok = not bad and all(st[k] == n for k in ("packed", "scale", "global", "dequant", "first"))
        failures += not ok
        rows.append((name, fmt, n, st["packed"], st["scale"], st["global"], st["dequant"], "ok" if ok else "MISMATCH"))
        for b in bad[:10]:
            print("  " + name + ": " + b)
    head = ("checkpoint", "format", "tensors", "packed", "scale", "global", "dequant=", "result")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = "  ".join("%-*s" % (widths[i], head[i]) for i in range(len(head)))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join("%-*s" % (widths[i], r[i]) for i in range(len(r))))
    print("\n%d checkpoint(s), %d with mismatches" % (len(rows), failures))
    sys.exit(1 if failures else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="generate and quantize with tandem (run where tandem is built)")
    p.add_argument("out")
    p.add_argument("--tandem", default="build/release/tandem")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--experts", type=int, default=0,
                   help="routed experts per layer (default: the preset's 64; 16 keeps OUT ~30 MB)")
    p.add_argument("--hf", help="directory written by scripts/hf_tiny_checkpoints.py")
    p.add_argument("--keep-inputs", action="store_true", help="keep the BF16 inputs")
    c = sub.add_parser("check", help="verify with safetensors + torch (run on the torch machine)")
    c.add_argument("dir")
    c.add_argument("--device", default="cpu", help="torch device for the dequantization (cpu, cuda)")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args)
    else:
        check(args)


if __name__ == "__main__":
    main()
