#!/usr/bin/env python3
"""Write tiny random checkpoints with the public transformers implementations.

Cross-check input for `tandem inspect` (and later `tandem quantize`): the tensor names, shapes
and config keys come from the public implementation itself, not from tandem. Run on a machine
with torch + transformers (qwen3_next and qwen4_exp); copy the output directory back and run
`tandem inspect --model DIR/<model>` on each.

    python3 scripts/hf_tiny_checkpoints.py OUTDIR

For each model it writes OUTDIR/<name>/ (save_pretrained, safetensors, sharded when the
model exceeds --shard) and OUTDIR/<name>.names.json (every state_dict name with dtype and
shape, plus the config as saved), and prints a summary. Nothing here is a dependency of
tandem itself.
"""
import argparse
import inspect
import json
import os
import sys
import traceback


def dump_names(model, path):
    sd = model.state_dict()
    rows = [{"name": k, "dtype": str(v.dtype), "shape": list(v.shape)} for k, v in sd.items()]
    with open(path, "w") as f:
        json.dump({"tensors": rows, "config": model.config.to_dict()}, f, indent=1, default=str)
    return len(rows)


def accepted(cls, kwargs):
    """Keep only keyword arguments the config class accepts (its signature or attributes)."""
    try:
        params = inspect.signature(cls.__init__).parameters
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return dict(kwargs)
        return {k: v for k, v in kwargs.items() if k in params}
    except (TypeError, ValueError):
        return dict(kwargs)


def qwen3_next(out, shard, torch, transformers):
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    kw = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, full_attention_interval=4,
              max_position_embeddings=512, tie_word_embeddings=False)
    cfg = Qwen3NextConfig(**accepted(Qwen3NextConfig, kw))
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).to(torch.bfloat16)
    d = os.path.join(out, "qwen3_next")
    model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    return dump_names(model, d + ".names.json")


def qwen4_exp(out, shard, torch, transformers):
    import transformers.models.qwen4_exp as q4

    names = [n for n in dir(q4) if n.startswith("Qwen4Exp")]
    print("qwen4_exp exports:", ", ".join(names))
    text_cfg_cls = getattr(q4, "Qwen4ExpTextConfig", None)
    causal = getattr(q4, "Qwen4ExpForCausalLM")
    kw = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4,
              layer_types=["linear_attention", "linear_attention", "linear_attention",
                           "full_attention"],
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4, output_gate_type="sigmoid",
              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
              shared_expert_intermediate_size=32, hc_count=4, hc_lowrank=16,
              indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=32,
              indexer_compress_ratio=4, ple_layer_ids=[2], ple_embed_dim=64,
              ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=8,
              ngram_vocab_size_base=1000, make_ngram_vocab_size_divisible_by=16,
              split_ngram_parts=4, eos_token_id=1, max_position_embeddings=512,
              tie_word_embeddings=False)
    cfg = text_cfg_cls(**accepted(text_cfg_cls, kw))
    torch.manual_seed(0)
    model = causal(cfg).to(torch.bfloat16)
    d = os.path.join(out, "qwen4_exp")
    model.save_pretrained(d, safe_serialization=True, max_shard_size=shard)
    return dump_names(model, d + ".names.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--shard", default="400KB", help="max_shard_size for save_pretrained")
    args = ap.parse_args()
    import torch
    import transformers

    print("torch", torch.__version__, "transformers", transformers.__version__)
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    for name, fn in (("qwen3_next", qwen3_next), ("qwen4_exp", qwen4_exp)):
        try:
            n = fn(args.out, args.shard, torch, transformers)
            files = sorted(os.listdir(os.path.join(args.out, name)))
            print(f"{name}: {n} tensors saved; files: {', '.join(files)}")
        except Exception:  # report and continue with the other model
            failures += 1
            print(f"{name}: FAILED")
            traceback.print_exc()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
