#!/usr/bin/env python3
"""Reference logits for tandem's scalar `ref` engine from the public qwen4_exp implementation.

Builds several tiny random Qwen4ExpForCausalLM (Qwen3.8-Flash-Next text) models that exercise
the parts of MODEL_SPEC.md part B a float32 reference has to get right: the 4-stream
hyper-connection residual, the hashed n-gram PLE block at layer index 1 (with EOS tokens inside
the prompts, so the hash segmentation matters), QSA layers with a small indexer budget and
compress ratio (so the block selection is not dense within the prompts), and prefill followed
by decode across 4-token block boundaries. Runs them in float32 on the CPU with the non-fused
torch code paths (eager attention; torch fallbacks for the GDN conv / delta rule, discovered at
run time and printed), saves each with save_pretrained and writes next to it:

  OUTDIR/<name>/                      the checkpoint (config.json + safetensors)
  OUTDIR/<name>.expected.safetensors  for every prompt i:
      prompt.<i>          int32 [T]      prompt token ids (contain eos_token_id)
      prefill.<i>         float32 [T, V] logits of one forward pass over the whole prompt
      decode.<i>          float32 [T, V] logits of a prefill of the first token, then
                                         one-token steps with the cache (row t = position t)
      split.<i>           float32 [T-k+1, V] logits of a prefill of the first k tokens (its
                                         last row), then one-token steps (row j = position k-1+j)
      split_at.<i>        int32 [1]      k
      greedy.<i>          int32 [N]      greedy completion (N = --max-new) from the prompt
                                         (prefill of the whole prompt, then one-token steps)
  OUTDIR/summary.json                 the table printed at the end

Usage (unattended; needs torch and transformers >= 5.17 with qwen4_exp; no network):

    python3 scripts/qwen4_exp_proof.py OUTDIR [--max-new 8] [--seed 0] [--only NAME]

Quantized repeat: `tandem quantize --in OUTDIR/<name> --out Q` on the tandem machine, then

    python3 scripts/qwen4_exp_proof.py OUTDIR --dequant Q --name <name>-nvfp4

writes OUTDIR/<name>-nvfp4.expected.safetensors from transformers run on the dequantized
weights (NVFP4: w = e2m1 * (e4m3 scale * weight_scale_2); FP8 tensors: e4m3 * weight_scale),
as tandem decodes them.

The script prints one row per model: layers, QSA/GDN layer counts, parameters, max |logit|,
and max |prefill - decode| / max |logit| (transformers' own prefill-vs-decode agreement, a
floor for what tandem can be held to). Every model is wrapped in try/except: a failure prints
its traceback and the script goes on with the next one. For the first model it also prints the
config and every state_dict name with its shape, so a failure can be diagnosed from the log.
Nothing here is a dependency of tandem.
"""
import argparse
import inspect
import json
import math
import os
import sys
import time
import traceback

EOS = 3  # eos_token_id of every model here (inside the vocabulary, placed inside the prompts)

# Layer type strings: transformers 5.17 writes "qwen_sparse_attention" for the QSA layers; the
# alternatives are tried in order when the config class rejects one.
QSA_NAMES = ["qwen_sparse_attention", "full_attention", "deepseek_sparse_attention", "hybrid_indexed"]

CONFIGS = [
    # name, overrides of BASE; "L" in layer_types = GDN, "A" = QSA attention
    ("q4e-a", dict(layer_types="LLLA")),
    ("q4e-heads", dict(num_attention_heads=6, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                       linear_num_value_heads=6, linear_key_head_dim=24, linear_value_head_dim=40,
                       indexer_n_heads=3, indexer_head_dim=24, indexer_budget=12, hc_lowrank=12,
                       layer_types="ALAL")),
    ("q4e-odd", dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=1, head_dim=24,
                     linear_num_key_heads=3, linear_num_value_heads=9, linear_key_head_dim=16,
                     linear_value_head_dim=16, linear_conv_kernel_dim=3, num_experts=5, num_experts_per_tok=3,
                     moe_intermediate_size=48, shared_expert_intermediate_size=32, vocab_size=301,
                     partial_rotary_factor=0.5, hc_lowrank=10, ple_embed_dim=80, heads_per_ngram=4,
                     ngram_vocab_size_base=211, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2,
                     indexer_n_heads=2, indexer_head_dim=16, indexer_budget=8,
                     layer_types="LLA")),
]

BASE = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_conv_kernel_dim=4, output_gate_type="sigmoid", num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, shared_expert_intermediate_size=32, norm_topk_prob=True,
            hc_count=4, hc_lowrank=16, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16,
            indexer_budget=8, indexer_compress_ratio=4, ple_layer_ids=[2], ple_embed_dim=64,
            ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=8, ngram_vocab_size_base=1000,
            make_ngram_vocab_size_divisible_by=16, split_ngram_parts=4, seed=1234, eos_token_id=EOS,
            rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
            partial_rotary_factor=0.25, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
            initializer_range=0.02)

# prompt lengths: 1 and 2 (edge), 5, 13 (first sparse selections with budget 8 = 2 blocks),
# 33 and 47 (many blocks, several unselected)
PROMPT_LENS = [1, 2, 5, 13, 33, 47]


def accepted(cls, kwargs):
    """Keep only keyword arguments the config class accepts (its signature, or everything when
    it takes **kwargs)."""
    try:
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return dict(kwargs)
        return {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        return dict(kwargs)


def text_config_class(q4):
    for n in ("Qwen4ExpTextConfig", "Qwen4ExpConfig"):
        c = getattr(q4, n, None)
        if c is not None:
            return c
    raise RuntimeError("transformers.models.qwen4_exp has no Qwen4ExpTextConfig / Qwen4ExpConfig")


def make_config(cls, over):
    kw = dict(BASE)
    kw.update(over)
    pattern = kw.pop("layer_types")
    kw["num_hidden_layers"] = len(pattern)
    theta = kw.pop("rope_theta")
    prf = kw.pop("partial_rotary_factor")
    last = None
    for qsa in QSA_NAMES:
        kw["layer_types"] = ["linear_attention" if ch == "L" else qsa for ch in pattern]
        for rope in (dict(rope_parameters={"rope_type": "default", "rope_theta": theta,
                                           "partial_rotary_factor": prf}),
                     dict(rope_theta=theta, partial_rotary_factor=prf)):
            try:
                cfg = cls(**accepted(cls, dict(kw, **rope)))
            except Exception as e:  # try the next spelling
                last = e
                continue
            # keep the keys tandem reads at the top level as well
            cfg.rope_theta = theta
            cfg.partial_rotary_factor = prf
            cfg._attn_implementation = "eager"
            return cfg
    raise RuntimeError(f"no accepted layer_types/rope spelling; last error: {last!r}")


def randomize(model, torch, gen):
    """Weights with O(1) activations: zero-centred norms near 0, GDN norm near 1, A_log and
    dt_bias in the released ranges, linears (HC mixers, projections, experts) ~ N(0, 1/fan_in),
    the n-gram table ~ N(0, 1/head_dim). Integer buffers (PLE multipliers, sizes, offsets) are
    buffers, not parameters, and stay as the model computed them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


# Attribute names a layer may hold for a fused kernel, and the module-level torch fallbacks that
# replace them (first one found wins). None = set the attribute to None (the layer then uses its
# own torch path).
FALLBACKS = {
    "causal_conv1d_fn": [None],
    "causal_conv1d_update": ["torch_causal_conv1d_update"],
    "chunk_gated_delta_rule": ["torch_chunk_gated_delta_rule"],
    "recurrent_gated_delta_rule": ["torch_recurrent_gated_delta_rule"],
    "fused_recurrent_gated_delta_rule": ["torch_recurrent_gated_delta_rule"],
}


def force_torch_paths(model, mod, verbose):
    """Make every layer take the torch code paths and report what was forced. transformers 5.x
    calls module-level functions (torch_* fallbacks on the CPU) or keeps kernels as attributes
    of each layer; both are handled, and module flags such as is_fast_path_available are
    cleared."""
    forced, counts = [], {}
    for flag in ("is_fast_path_available", "is_flash_linear_attention_available", "is_causal_conv1d_available"):
        if isinstance(getattr(mod, flag, None), bool) and getattr(mod, flag):
            setattr(mod, flag, False)
            forced.append(f"module.{flag}=False")
    torch_fns = sorted(n for n in dir(mod) if n.startswith("torch_") and callable(getattr(mod, n)))
    for m in model.modules():
        cls = type(m).__name__
        counts[cls] = counts.get(cls, 0) + 1
        for attr, repls in FALLBACKS.items():
            if not hasattr(m, attr):
                continue
            for r in repls:
                fn = None if r is None else getattr(mod, r, None)
                if r is not None and fn is None:
                    continue
                if getattr(m, attr) is not fn:
                    setattr(m, attr, fn)
                    if counts[cls] == 1:
                        forced.append(f"{cls}.{attr} -> {r}")
                break
    if verbose:
        print("torch fallbacks in the module:", ", ".join(torch_fns) or "(none)")
        print("forced:", "; ".join(forced) or "(nothing: the layers already take torch paths)")
        print("module classes:", ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()) if k.startswith("Qwen4")))
    n_gdn = sum(v for k, v in counts.items() if "GatedDeltaNet" in k)
    n_attn = sum(v for k, v in counts.items() if k.endswith("Attention") and "DeltaNet" not in k)
    return n_gdn, n_attn


def make_prompts(V, seed, torch):
    """Random prompts with eos_token_id inside (not at the first position for T >= 5, twice
    for the longer ones, once directly followed by another EOS) and never at the end."""
    pg = torch.Generator().manual_seed(seed + 2)
    prompts = []
    for T in PROMPT_LENS:
        ids = torch.randint(0, V, (T,), generator=pg)
        ids[ids == EOS] = EOS + 1
        if T >= 5:
            ids[T // 3] = EOS
        if T >= 13:
            ids[(2 * T) // 3] = EOS
        if T >= 33:
            ids[(2 * T) // 3 + 1] = EOS
        if T == 2:
            ids[0] = EOS
        prompts.append(ids.view(1, T))
    return prompts


def step(model, ids, cache, torch):
    o = model(input_ids=ids, past_key_values=cache, use_cache=True)
    return o.logits[0, -1], o.past_key_values


def write_expected(model, V, args, path, torch, tf, save_file):
    """Prompts, whole-prompt logits, token-by-token and split logits, greedy completions."""
    tensors = {}
    worst_pd = 0.0
    max_logit = 0.0
    prompts = make_prompts(V, args.seed, torch)
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            T = ids.shape[1]
            tensors[f"prompt.{i}"] = ids[0].to(torch.int32).contiguous()
            pre = model(input_ids=ids, use_cache=False).logits[0].float()
            tensors[f"prefill.{i}"] = pre.contiguous()
            rows = []
            o = model(input_ids=ids[:, :1], use_cache=True)
            rows.append(o.logits[0, -1])
            cache = o.past_key_values
            for t in range(1, T):
                r, cache = step(model, ids[:, t:t + 1], cache, torch)
                rows.append(r)
            dec = torch.stack(rows).float()
            tensors[f"decode.{i}"] = dec.contiguous()
            # prefill of the first k tokens (k not a multiple of 4), then one-token steps
            k = max(1, T - 5)
            o = model(input_ids=ids[:, :k], use_cache=True)
            rows = [o.logits[0, -1]]
            cache = o.past_key_values
            for t in range(k, T):
                r, cache = step(model, ids[:, t:t + 1], cache, torch)
                rows.append(r)
            tensors[f"split.{i}"] = torch.stack(rows).float().contiguous()
            tensors[f"split_at.{i}"] = torch.tensor([k], dtype=torch.int32)
            m = float(pre.abs().max())
            max_logit = max(max_logit, m)
            worst_pd = max(worst_pd, float((pre - dec).abs().max()) / max(m, 1e-30))
            # greedy completion: prefill the prompt once, then one-token steps
            o = model(input_ids=ids, use_cache=True)
            cache = o.past_key_values
            toks = []
            nxt = int(o.logits[0, -1].argmax())
            for _ in range(args.max_new):
                toks.append(nxt)
                r, cache = step(model, torch.tensor([[nxt]]), cache, torch)
                nxt = int(r.argmax())
            tensors[f"greedy.{i}"] = torch.tensor(toks, dtype=torch.int32)
    save_file(tensors, path,
              metadata={"transformers": tf.__version__, "torch": torch.__version__, "seed": str(args.seed),
                        "eos_token_id": str(EOS)})
    return worst_pd, max_logit, len(prompts)


def rotary_facts(model, cfg):
    """(rotary dim, theta) the model actually uses, from its inv_freq buffer."""
    for name, b in model.named_buffers():
        if name.endswith("inv_freq"):
            rot = 2 * b.numel()
            theta = None
            if b.numel() > 1 and float(b[1]) > 0:
                theta = float(b[1]) ** (-rot / 2.0)
            return rot, theta, name
    return None, None, None


def patch_config(path, cfg, model):
    """Make sure config.json states partial_rotary_factor and rope_theta explicitly (tandem
    reads them; transformers may leave a class default out of the file). The values are the
    ones the model computed its rotary table from."""
    p = os.path.join(path, "config.json")
    with open(p) as f:
        cj = json.load(f)
    rot, theta, bname = rotary_facts(model, cfg)
    hd = getattr(cfg, "head_dim", None)
    notes = []
    if rot is not None and hd:
        prf = rot / hd
        rp = cj.get("rope_parameters") or {}
        if rp.get("partial_rotary_factor") != prf:
            notes.append(f"rope_parameters.partial_rotary_factor {rp.get('partial_rotary_factor')} -> {prf} "
                         f"(from {bname})")
            rp["partial_rotary_factor"] = prf
        if "rope_theta" not in rp:
            rp["rope_theta"] = cfg.rope_theta
            notes.append(f"rope_parameters.rope_theta -> {cfg.rope_theta}")
        rp.setdefault("rope_type", "default")
        cj["rope_parameters"] = rp
        if theta is not None and abs(theta - rp["rope_theta"]) > 1e-3 * rp["rope_theta"]:
            notes.append(f"WARNING: inv_freq implies theta {theta:.6g}, config says {rp['rope_theta']}")
    if cj.get("eos_token_id") is None:
        cj["eos_token_id"] = EOS
        notes.append(f"eos_token_id -> {EOS}")
    with open(p, "w") as f:
        json.dump(cj, f, indent=1)
    return notes


def describe(model, cfg):
    print("config:", json.dumps(cfg.to_dict(), indent=1, default=str))
    print("state_dict:")
    for k, v in model.state_dict().items():
        print(f"  {k} {str(v.dtype).replace('torch.', '')} {list(v.shape)}")
    for name, b in model.named_buffers():
        if "ple" in name and b.numel() <= 64:
            print(f"  buffer {name} = {b.tolist()}")


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def fp8_scale_name(k, keys):
    """The per-tensor scale of an FP8 tensor: NAME.weight_scale, or for a shard of a sharded
    table (X.shard_I.weight) the table's X.weight_scale."""
    base = k[:-len(".weight")] if k.endswith(".weight") else k
    while base:
        if base + ".weight_scale" in keys:
            return base + ".weight_scale"
        if "." not in base:
            break
        base = base.rsplit(".", 1)[0]
    return None


def dequantize(qdir, ddir, torch):
    """A ModelOpt checkpoint (as `tandem quantize` writes it) as a float32 checkpoint: NVFP4
    w = e2m1(code) * fl32(fl32(e4m3 scale) * weight_scale_2), element 2j in the low nibble;
    FP8 w = fl32(e4m3) * weight_scale; everything else widened to float32. Returns the counts."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    files = [f for f in os.listdir(qdir) if f.endswith(".safetensors")]
    keys = set()
    for fn in files:
        with safe_open(os.path.join(qdir, fn), framework="pt") as f:
            keys |= set(f.keys())
    scales = {}
    for fn in files:
        with safe_open(os.path.join(qdir, fn), framework="pt") as f:
            for k in f.keys():
                if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
                    scales[k] = f.get_tensor(k)
    out, n4, n8 = {}, 0, 0
    lut = torch.tensor(E2M1, dtype=torch.float32)
    f8 = getattr(torch, "float8_e4m3fn", None)
    for fn in files:
        with safe_open(os.path.join(qdir, fn), framework="pt") as f:
            for k in f.keys():
                if k in scales:
                    continue
                t = f.get_tensor(k)
                base = k[:-len(".weight")] if k.endswith(".weight") else None
                if base and t.dtype == torch.uint8 and base + ".weight_scale" in keys:
                    sc = scales[base + ".weight_scale"].float()
                    g = scales[base + ".weight_scale_2"].float().reshape(())
                    eff = (sc * g).to(torch.float32)
                    lo = lut[(t & 15).long()]
                    hi = lut[(t >> 4).long()]
                    codes = torch.stack([lo, hi], dim=-1).reshape(t.shape[0], t.shape[1] * 2)
                    out[k] = (codes * eff.repeat_interleave(16, dim=1)).contiguous()
                    n4 += 1
                elif f8 is not None and t.dtype == f8:
                    sn = fp8_scale_name(k, keys)
                    s = scales[sn].float().reshape(()) if sn else torch.tensor(1.0)
                    out[k] = (t.float() * s).contiguous()
                    n8 += 1
                elif t.is_floating_point():
                    out[k] = t.float().contiguous()
                else:
                    out[k] = t.contiguous()
    os.makedirs(ddir, exist_ok=True)
    save_file(out, os.path.join(ddir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(qdir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    with open(os.path.join(ddir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return n4, n8


def run_dequant(args, torch, tf, q4, mod, save_file):
    """--dequant QDIR: transformers on the dequantized weights of a quantized checkpoint."""
    ddir = os.path.join(args.outdir, args.name + ".dequant")
    n4, n8 = dequantize(args.dequant, ddir, torch)
    causal = getattr(q4, "Qwen4ExpForCausalLM")
    model = causal.from_pretrained(ddir, dtype=torch.float32, attn_implementation="eager").eval()
    force_torch_paths(model, mod, True)
    worst_pd, max_logit, _ = write_expected(model, model.config.vocab_size, args,
                                            os.path.join(args.outdir, f"{args.name}.expected.safetensors"),
                                            torch, tf, save_file)
    print(f"{args.name}: {n4} NVFP4 and {n8} FP8 tensors dequantized; max|logit| {max_logit:.4g}, "
          f"transformers prefill vs decode {worst_pd:.3g}")
    return 0


def run_one(idx, name, over, args, out, torch, tf, q4, mod, save_file):
    cls = text_config_class(q4)
    cfg = make_config(cls, over)
    causal = getattr(q4, "Qwen4ExpForCausalLM")
    torch.manual_seed(args.seed)
    model = causal(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    randomize(model, torch, gen)
    n_gdn, n_attn = force_torch_paths(model, mod, idx == 0)
    if idx == 0:
        describe(model, cfg)
    path = os.path.join(out, name)
    model.save_pretrained(path, safe_serialization=True)
    notes = patch_config(path, cfg, model)
    for n in notes:
        print(f"{name}: config.json: {n}")
    worst_pd, max_logit, nprompts = write_expected(model, cfg.vocab_size, args,
                                                   os.path.join(out, f"{name}.expected.safetensors"),
                                                   torch, tf, save_file)
    params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return dict(name=name, layers=cfg.num_hidden_layers, gdn_layers=n_gdn, attn_layers=n_attn, params=params,
                bytes=size, max_logit=max_logit, prefill_vs_decode=worst_pd, prompts=nprompts,
                config_notes=notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--dequant", default=None, metavar="QDIR",
                    help="instead: expected logits of transformers on the dequantized weights of the "
                         "quantized checkpoint QDIR (e.g. tandem quantize of a model written here)")
    ap.add_argument("--name", default="dequant", help="with --dequant: output name")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers as tf
    from safetensors.torch import save_file
    import transformers.models.qwen4_exp as q4
    from transformers.models.qwen4_exp import modeling_qwen4_exp as mod
    print("torch", torch.__version__, "transformers", tf.__version__)
    print("qwen4_exp exports:", ", ".join(n for n in dir(q4) if n.startswith("Qwen4Exp")))
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.outdir, exist_ok=True)
    if args.dequant:
        return run_dequant(args, torch, tf, q4, mod, save_file)
    rows, failed = [], 0
    for idx, (name, over) in enumerate(CONFIGS):
        if args.only and name != args.only:
            continue
        t0 = time.time()
        try:
            r = run_one(idx if not args.only else 0, name, over, args, args.outdir, torch, tf, q4, mod, save_file)
            r["seconds"] = round(time.time() - t0, 2)
            rows.append(r)
        except Exception:
            failed += 1
            print(f"{name}: FAILED")
            traceback.print_exc()
            rows.append(dict(name=name, error=traceback.format_exc().splitlines()[-1]))
    print(f"transformers {tf.__version__}, torch {torch.__version__}, float32, CPU, torch code paths")
    print(f"{'model':12} {'layers':>6} {'gdn':>4} {'attn':>4} {'params':>9} {'bytes':>10} {'max|logit|':>11} "
          f"{'pre-vs-dec':>11} {'s':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:12} ERROR {r['error']}")
            continue
        print(f"{r['name']:12} {r['layers']:6d} {r['gdn_layers']:4d} {r['attn_layers']:4d} {r['params']:9d} "
              f"{r['bytes']:10d} {r['max_logit']:11.4g} {r['prefill_vs_decode']:11.3g} {r['seconds']:6.1f}")
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump(dict(transformers=tf.__version__, torch=torch.__version__, rows=rows), f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
