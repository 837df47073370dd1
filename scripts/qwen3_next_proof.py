#!/usr/bin/env python3
"""Reference logits for tandem's scalar `ref` engine from the public qwen3_next implementation.

Builds several tiny random Qwen3NextForCausalLM models (different head counts, layer patterns
and odd sizes), runs them in float32 on the CPU with the non-fused torch code paths (eager
attention, torch causal conv, torch chunked and recurrent gated delta rule), saves each with
save_pretrained, and writes next to it:

  OUTDIR/<name>/                      the checkpoint (config.json + safetensors)
  OUTDIR/<name>.expected.safetensors  for every prompt i:
      prompt.<i>          int32 [T]      prompt token ids
      prefill.<i>         float32 [T, V] logits of one forward pass over the whole prompt
      decode.<i>          float32 [T, V] logits of a prefill of the first token, then
                                         one-token steps with the cache (row t = position t)
      greedy.<i>          int32 [N]      greedy completion (N = --max-new) from the prompt,
                                         one-token steps with the cache
  OUTDIR/summary.json                 the table printed at the end

Usage (unattended; needs torch and transformers >= 5 with qwen3_next):

    python3 scripts/qwen3_next_proof.py OUTDIR [--max-new 8] [--seed 0] [--only NAME]

Quantized repeat: `tandem quantize --in OUTDIR/<name> --out Q` on the tandem machine, then

    python3 scripts/qwen3_next_proof.py OUTDIR --dequant Q --name <name>-nvfp4

writes OUTDIR/<name>-nvfp4.expected.safetensors from transformers run on the dequantized
weights (w = e2m1 * (e4m3 scale * weight_scale_2), as tandem decodes them).

Then on the tandem side: `tandem run --model OUTDIR/<name> --prompts P --engines ref ...` and
compare logits against the expected file (docs/ref-model.md, "Proof against the public
implementation"). The script prints one row per model: layers, parameters, max |logit|, and
max |prefill - decode| / max |logit| (the public implementation's own chunked-vs-recurrent
agreement, a floor for what tandem can be held to). Nothing here is a dependency of tandem.
"""
import argparse
import json
import math
import os
import sys
import time
import traceback

CONFIGS = [
    # name, overrides of the base config
    ("q3n-a", dict(layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])),
    ("q3n-heads", dict(num_attention_heads=6, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                       linear_num_value_heads=6, linear_key_head_dim=24, linear_value_head_dim=40,
                       layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention",
                                    "linear_attention"])),
    ("q3n-odd", dict(hidden_size=80, num_attention_heads=5, num_key_value_heads=1, head_dim=24,
                     linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=16,
                     linear_value_head_dim=16, linear_conv_kernel_dim=3, num_experts=5, num_experts_per_tok=3,
                     moe_intermediate_size=48, shared_expert_intermediate_size=32, vocab_size=301,
                     partial_rotary_factor=0.5,
                     layer_types=["linear_attention", "full_attention", "linear_attention"])),
    ("q3n-norenorm", dict(norm_topk_prob=False, num_experts=16, num_experts_per_tok=4,
                          layer_types=["linear_attention", "full_attention"])),
]

BASE = dict(vocab_size=512, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            intermediate_size=256, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
            partial_rotary_factor=0.25, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
            initializer_range=0.02)


def make_config(Qwen3NextConfig, over):
    kw = dict(BASE)
    kw.update(over)
    kw["num_hidden_layers"] = len(kw["layer_types"])
    theta = kw.pop("rope_theta")
    prf = kw.pop("partial_rotary_factor")
    try:
        cfg = Qwen3NextConfig(rope_parameters={"rope_type": "default", "rope_theta": theta,
                                               "partial_rotary_factor": prf}, **kw)
    except TypeError:
        cfg = Qwen3NextConfig(rope_theta=theta, partial_rotary_factor=prf, **kw)
    # keep the keys tandem reads at the top level as well
    cfg.rope_theta = theta
    cfg.partial_rotary_factor = prf
    return cfg


def randomize(model, torch, gen):
    """Weights with O(1) activations: zero-centred norms near 0, GDN norm near 1, A_log and
    dt_bias in the released ranges, linears ~ N(0, 1/fan_in)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
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
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def force_torch_paths(model, mod):
    """Count the GDN layers and make sure they take the torch code paths. transformers 5.x
    calls module-level functions (torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule
    and causal_conv1d_fn / causal_conv1d_update, which fall back to torch on the CPU); older
    versions keep them as attributes of each layer, which are reset here when present."""
    n = 0
    for m in model.modules():
        if type(m).__name__ == "Qwen3NextGatedDeltaNet":
            for attr, repl in (("causal_conv1d_fn", None),
                               ("causal_conv1d_update", getattr(mod, "torch_causal_conv1d_update", None)),
                               ("chunk_gated_delta_rule", getattr(mod, "torch_chunk_gated_delta_rule", None)),
                               ("recurrent_gated_delta_rule", getattr(mod, "torch_recurrent_gated_delta_rule", None))):
                if hasattr(m, attr) and (repl is not None or attr == "causal_conv1d_fn"):
                    setattr(m, attr, repl)
            n += 1
    return n


def write_expected(model, V, args, path, torch, tf, save_file):
    """Prompts, whole-prompt logits, token-by-token logits and greedy completions (see the top)."""
    pg = torch.Generator().manual_seed(args.seed + 2)
    lens = [1, 2, 5, 13, 33]
    tensors = {}
    worst_pd = 0.0
    max_logit = 0.0
    with torch.no_grad():
        for i, T in enumerate(lens):
            ids = torch.randint(0, V, (1, T), generator=pg)
            tensors[f"prompt.{i}"] = ids[0].to(torch.int32).contiguous()
            pre = model(input_ids=ids, use_cache=False).logits[0].float()
            tensors[f"prefill.{i}"] = pre.contiguous()
            rows = []
            o = model(input_ids=ids[:, :1], use_cache=True)
            rows.append(o.logits[0, -1])
            cache = o.past_key_values
            for t in range(1, T):
                o = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True)
                cache = o.past_key_values
                rows.append(o.logits[0, -1])
            dec = torch.stack(rows).float()
            tensors[f"decode.{i}"] = dec.contiguous()
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
                o = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
                cache = o.past_key_values
                nxt = int(o.logits[0, -1].argmax())
            tensors[f"greedy.{i}"] = torch.tensor(toks, dtype=torch.int32)
    save_file(tensors, path,
              metadata={"transformers": tf.__version__, "torch": torch.__version__, "seed": str(args.seed)})
    return worst_pd, max_logit, len(lens)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantize(qdir, ddir, torch):
    """A ModelOpt NVFP4 checkpoint (as `tandem quantize` writes it) as a float32 checkpoint:
    w = e2m1(code) * fl32(fl32(e4m3 scale) * weight_scale_2), element 2j in the low nibble;
    everything else widened to float32. Returns the number of NVFP4 tensors."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    files = [f for f in os.listdir(qdir) if f.endswith(".safetensors")]
    out, n = {}, 0
    lut = torch.tensor(E2M1, dtype=torch.float32)
    for fn in files:
        with safe_open(os.path.join(qdir, fn), framework="pt") as f:
            keys = set(f.keys())
            for k in keys:
                if k.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
                    continue
                t = f.get_tensor(k)
                base = k[:-len(".weight")] if k.endswith(".weight") else None
                if base and t.dtype == torch.uint8 and base + ".weight_scale" in keys:
                    sc = f.get_tensor(base + ".weight_scale").float()
                    g = f.get_tensor(base + ".weight_scale_2").float().reshape(())
                    eff = (sc * g).to(torch.float32)
                    lo = lut[(t & 15).long()]
                    hi = lut[(t >> 4).long()]
                    codes = torch.stack([lo, hi], dim=-1).reshape(t.shape[0], t.shape[1] * 2)
                    w = codes * eff.repeat_interleave(16, dim=1)
                    out[k] = w.contiguous()
                    n += 1
                else:
                    out[k] = t.float().contiguous()
    os.makedirs(ddir, exist_ok=True)
    save_file(out, os.path.join(ddir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(qdir, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    with open(os.path.join(ddir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return n


def run_dequant(args, torch, tf, mod, save_file):
    """--dequant QDIR: transformers on the dequantized weights of an NVFP4 checkpoint."""
    ddir = os.path.join(args.outdir, args.name + ".dequant")
    n = dequantize(args.dequant, ddir, torch)
    model = tf.Qwen3NextForCausalLM.from_pretrained(ddir, dtype=torch.float32, attn_implementation="eager").eval()
    force_torch_paths(model, mod)
    worst_pd, max_logit, _ = write_expected(model, model.config.vocab_size, args,
                                            os.path.join(args.outdir, f"{args.name}.expected.safetensors"),
                                            torch, tf, save_file)
    print(f"{args.name}: {n} NVFP4 tensors dequantized; max|logit| {max_logit:.4g}, "
          f"transformers prefill vs decode {worst_pd:.3g}")
    return 0


def run_one(name, over, args, out, torch, tf, mod, save_file):
    cfg = make_config(tf.Qwen3NextConfig, over)
    cfg._attn_implementation = "eager"
    torch.manual_seed(args.seed)
    model = tf.Qwen3NextForCausalLM(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    randomize(model, torch, gen)
    n_gdn = force_torch_paths(model, mod)
    path = os.path.join(out, name)
    model.save_pretrained(path, safe_serialization=True)
    worst_pd, max_logit, nprompts = write_expected(model, cfg.vocab_size, args, os.path.join(out, f"{name}.expected.safetensors"),
                                                   torch, tf, save_file)
    params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return dict(name=name, layers=cfg.num_hidden_layers, gdn_layers=n_gdn, params=params, bytes=size,
                max_logit=max_logit, prefill_vs_decode=worst_pd, prompts=nprompts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--dequant", default=None, metavar="QDIR",
                    help="instead: expected logits of transformers on the dequantized weights of the "
                         "ModelOpt NVFP4 checkpoint QDIR (e.g. tandem quantize of a model written here)")
    ap.add_argument("--name", default="dequant", help="with --dequant: output name")
    args = ap.parse_args()
    import torch
    import transformers as tf
    from safetensors.torch import save_file
    from transformers.models.qwen3_next import modeling_qwen3_next as mod
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.outdir, exist_ok=True)
    if args.dequant:
        return run_dequant(args, torch, tf, mod, save_file)
    rows, failed = [], 0
    for name, over in CONFIGS:
        if args.only and name != args.only:
            continue
        t0 = time.time()
        try:
            r = run_one(name, over, args, args.outdir, torch, tf, mod, save_file)
            r["seconds"] = round(time.time() - t0, 2)
            rows.append(r)
        except Exception:
            failed += 1
            traceback.print_exc()
            rows.append(dict(name=name, error=traceback.format_exc().splitlines()[-1]))
    print(f"transformers {tf.__version__}, torch {torch.__version__}, float32, CPU, torch code paths")
    print(f"{'model':14} {'layers':>6} {'gdn':>4} {'params':>9} {'bytes':>10} {'max|logit|':>11} "
          f"{'pre-vs-dec':>11} {'s':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:14} ERROR {r['error']}")
            continue
        print(f"{r['name']:14} {r['layers']:6d} {r['gdn_layers']:4d} {r['params']:9d} {r['bytes']:10d} "
              f"{r['max_logit']:11.4g} {r['prefill_vs_decode']:11.3g} {r['seconds']:6.1f}")
    with open(os.path.join(args.outdir, "summary.json"), "w") as f:
        json.dump(dict(transformers=tf.__version__, torch=torch.__version__, rows=rows), f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
