#!/usr/bin/env python3
"""st_crosscheck.py — cross-check tandem's safetensors reader and writer against the public
`safetensors` Python package (numpy backend; torch is used too when it is installed).

Needs Python 3.8+, numpy and safetensors. The procedure (docs/safetensors.md):

    TD_ST_CROSSCHECK_DIR=DIR build/release/tests/test_safetensors   # 1. tandem writes DIR/c
    python3 scripts/st_crosscheck.py DIR                            # 2. checks DIR/c, writes DIR/py
    TD_ST_CROSSCHECK_DIR=DIR build/release/tests/test_safetensors   # 3. tandem verifies DIR/py

Step 2 (a) opens every DIR/c/*.safetensors with the public library (whose Rust core validates
the header and layout), and compares names, dtypes, shapes, metadata and the SHA-256 of each
tensor's bytes with DIR/c/manifest.json, which tandem's test wrote from the source buffers.
Tensors whose dtype numpy cannot hold (BF16, F8_*, F4, F6_*) are compared through the
library's dtype and shape and an independent byte slice of the file. (b) then writes
DIR/py/*.safetensors with the public library (every numpy dtype it supports, scalars,
zero-size tensors, metadata, names needing escapes, an empty file) plus DIR/py/manifest.json
in the same format, for step 3.

Exit status 0 when everything matched; the last line reads "N passed, N failed".
"""
import glob
import hashlib
import json
import os
import struct
import sys

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # pragma: no cover - environment problem, not a check failure
    sys.exit("st_crosscheck: needs numpy and safetensors (%s)" % e)

NUMPY_DTYPES = [  # (safetensors name, numpy dtype)
    ("BOOL", np.bool_), ("U8", np.uint8), ("I8", np.int8), ("I16", np.int16),
    ("U16", np.uint16), ("F16", np.float16), ("I32", np.int32), ("U32", np.uint32),
    ("F32", np.float32), ("F64", np.float64), ("I64", np.int64), ("U64", np.uint64),
    ("C64", np.complex64),
]
ST_NAME = {np.dtype(d): n for n, d in NUMPY_DTYPES}

META = {"format": "np", "note": 'quote " backslash \\ newline \n tab \t', "\u00fcnicode": "\u2713"}


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, what):
        self.passed += 1

    def bad(self, what):
        self.failed += 1
        print("FAIL:", what)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def le_bytes(arr):
    """Raw little-endian C-order bytes of a numpy array."""
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a.tobytes()


def raw_slice(path, name):
    """Bytes of tensor `name`, sliced by our own reading of the header (no library)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        begin, end = header[name]["data_offsets"]
        f.seek(8 + n + begin)
        return f.read(end - begin)


# ---- (a) tandem-written files -> public library -----------------------------------------------

def check_tandem_files(cdir, t):
    with open(os.path.join(cdir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    listed = {e["file"] for e in manifest["files"]}
    for path in sorted(glob.glob(os.path.join(cdir, "*.safetensors"))):
        if os.path.basename(path) not in listed:
            t.bad("%s: not in manifest.json" % path)
    for entry in manifest["files"]:
        path = os.path.join(cdir, entry["file"])
        want = {x["name"]: x for x in entry["tensors"]}
        try:
            f = safe_open(path, framework="numpy")
        except Exception as e:  # noqa: BLE001 - the library's verdict is the result
            newer = {x["dtype"] for x in entry["tensors"]} - {n for n, _ in NUMPY_DTYPES} - {
                "BF16", "F8_E4M3", "F8_E5M2"}
            msg = str(e)
            if newer and (any(d in msg for d in newer) or "variant" in msg or "dtype" in msg.lower()):
                print("SKIP: %s: safetensors %s does not know %s (%s)" % (
                    path, safetensors.__version__, ", ".join(sorted(newer)), msg))
                continue
            t.bad("%s: public library rejects a tandem file: %s" % (path, e))
            continue
        with f:
            keys = set(f.keys())
            if keys != set(want):
                t.bad("%s: names differ: library %s, manifest %s" % (path, sorted(keys), sorted(want)))
            else:
                t.ok(path)
            meta = f.metadata() or {}
            if meta != entry["metadata"]:
                t.bad("%s: metadata differs: library %r, manifest %r" % (path, meta, entry["metadata"]))
            else:
                t.ok(path)
            for name in sorted(keys & set(want)):
                w = want[name]
                sl = f.get_slice(name)
                dtype, shape = sl.get_dtype(), list(sl.get_shape())
                if dtype != w["dtype"] or shape != w["shape"]:
                    t.bad("%s: %r: library says %s %s, manifest %s %s" % (
                        path, name, dtype, shape, w["dtype"], w["shape"]))
                    continue
                try:
                    arr = f.get_tensor(name)
                    data, how = le_bytes(arr), "numpy"
                    if list(arr.shape) != w["shape"]:
                        t.bad("%s: %r: numpy shape %s" % (path, name, list(arr.shape)))
                except Exception:  # noqa: BLE001 - dtype numpy cannot hold
                    data, how = raw_slice(path, name), "raw"
                if sha(data) != w["sha256"]:
                    t.bad("%s: %r: bytes differ (%s)" % (path, name, how))
                else:
                    t.ok(name)
        # the one-call loader too, where numpy can hold every dtype
        if all(x["dtype"] in ST_NAME.values() for x in entry["tensors"]):
            try:
                loaded = load_file(path)
                for name, w in want.items():
                    if sha(le_bytes(loaded[name])) != w["sha256"]:
                        t.bad("%s: %r: load_file bytes differ" % (path, name))
                t.ok(path)
            except Exception as e:  # noqa: BLE001
                t.bad("%s: load_file failed: %s" % (path, e))


# ---- (b) public library -> files for tandem ---------------------------------------------------

def values(dtype, shape, seed):
    n = int(np.prod(shape)) if len(shape) else 1
    x = (np.arange(n, dtype=np.int64) * 37 + seed * 11) % 251 - 100
    if dtype == np.bool_:
        return (x % 2 == 0).reshape(shape)
    if np.issubdtype(dtype, np.unsignedinteger):
        x = np.abs(x)
    if np.issubdtype(dtype, np.complexfloating):
        return (x.astype(np.float32) * 0.5 + 1j * x.astype(np.float32)).astype(dtype).reshape(shape)
    if np.issubdtype(dtype, np.floating):
        return (x.astype(np.float64) * 0.375).astype(dtype).reshape(shape)
    return x.astype(dtype).reshape(shape)


def entry_for(fname, tensors, metadata, raw=None):
    out = []
    for name, arr in sorted(tensors.items()):
        b = raw[name] if raw and name in raw else le_bytes(arr)
        dt = ST_NAME.get(np.dtype(arr.dtype)) if not (raw and name in raw) else raw[name + "#dtype"]
        out.append({"name": name, "dtype": dt, "shape": list(arr.shape), "sha256": sha(b)})
    return {"file": fname, "metadata": metadata or {}, "tensors": out}


def try_save(tensors, path, metadata):
    try:
        save_file(tensors, path, metadata=metadata)
        return True
    except Exception as e:  # noqa: BLE001
        print("note: %s: %s" % (os.path.basename(path), e))
        return False


def write_library_files(pydir, t):
    os.makedirs(pydir, exist_ok=True)
    files = []

    def add(fname, tensors, metadata=None):
        path = os.path.join(pydir, fname)
        if try_save(tensors, path, metadata):
            files.append(entry_for(fname, tensors, metadata))
            t.ok(fname)
            return True
        return False

    shapes = [(2, 3), (5,), (2, 1, 3), (4, 2)]
    dtypes = {}
    for i, (name, dt) in enumerate(NUMPY_DTYPES):
        arr = values(dt, shapes[i % len(shapes)], i)
        # C64 is newer than the rest: keep it out of the main file if this version lacks it
        if name == "C64" and not try_save({"probe": arr}, os.path.join(pydir, "probe.tmp"), None):
            continue
        dtypes["t." + name] = arr
    if os.path.exists(os.path.join(pydir, "probe.tmp")):
        os.remove(os.path.join(pydir, "probe.tmp"))
    if not add("numpy_dtypes.safetensors", dtypes, META):
        t.bad("numpy_dtypes.safetensors: public library could not write it")
    add("scalars_empty.safetensors", {
        "scalar.f32": np.array(1.5, dtype=np.float32),
        "scalar.i64": np.array(-7, dtype=np.int64),
        "scalar.bool": np.array(True),
        "empty.f32": np.zeros((0, 4), dtype=np.float32),
        "empty.u8": np.zeros((3, 0), dtype=np.uint8),
        "empty.f16": np.zeros((0,), dtype=np.float16),
    })
    add("names.safetensors", {
        'q"uote\\back\nnl\x01ctl': values(np.int16, (3,), 1),
        "\u00fcnic\u00f8de.w": values(np.uint8, (3,), 2),
        "model.layers.0.mlp.experts.511.down_proj.weight": values(np.uint8, (4, 8), 3),
    }, {"k": "v"})
    add("alignment_mix.safetensors", {
        "a.f64": values(np.float64, (7,), 4), "b.u8": values(np.uint8, (13,), 5),
        "c.f16": values(np.float16, (5, 3), 6), "d.i32": values(np.int32, (11,), 7),
        "e.bool": values(np.bool_, (3,), 8),
    })
    add("empty.safetensors", {})
    add("meta_only.safetensors", {}, META)

    try:  # dtypes numpy lacks, through torch when it is installed
        import torch
        from safetensors.torch import save_file as torch_save
        tensors, raw = {}, {}
        cands = [("BF16", "bfloat16"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")]
        for i, (st_name, attr) in enumerate(cands):
            if not hasattr(torch, attr):
                continue
            x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 0.25 - 1.0 + i
            x = x.to(getattr(torch, attr))
            name = "t." + st_name
            tensors[name] = x
            raw[name] = bytes(x.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            raw[name + "#dtype"] = st_name
        if tensors:
            fname = "torch_dtypes.safetensors"
            torch_save(tensors, os.path.join(pydir, fname), metadata={"format": "pt"})
            shaped = {n: np.zeros(tuple(v.shape), dtype=np.uint8) for n, v in tensors.items()}
            files.append(entry_for(fname, shaped, {"format": "pt"}, raw))
            t.ok(fname)
    except ImportError:
        print("note: torch not installed; BF16/F8 files from the public library skipped")

    with open(os.path.join(pydir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"library": "safetensors " + safetensors.__version__, "files": files}, f,
                  indent=1, ensure_ascii=False)
    print("wrote %d files and manifest.json to %s" % (len(files), pydir))


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    base = argv[1]
    t = Tally()
    cdir = os.path.join(base, "c")
    if os.path.exists(os.path.join(cdir, "manifest.json")):
        check_tandem_files(cdir, t)
    else:
        print("note: %s/manifest.json missing; run the C test with TD_ST_CROSSCHECK_DIR first" % cdir)
    write_library_files(os.path.join(base, "py"), t)
    print("safetensors %s, numpy %s" % (safetensors.__version__, np.__version__))
    print("%d passed, %d failed" % (t.passed, t.failed))
    return 1 if t.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
