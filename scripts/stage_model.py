#!/usr/bin/env python3
"""stage_model.py - how many times the grouped prefill call's decode kernels stage their input
rows, and how many 16-byte pieces they stage, at the production shape (docs/perf.md, "The BF16
epilogue factors once per staging").

A host model of the engine's grouped dispatch on the decode kernel (cuda/moe_mma.cu,
cuda/group_pack.h): M tokens with top-k distinct random experts each; an expert's slots in
groups of at most 24 (TD_GROUP_PACK_DEC); each group's row tiles dealt to blocks of 16 warps,
TBX items per group (W13: 1,280 rows / 16 / 16 = 5; W2: 2,560 / 16 / 16 = 10); an item of a group
of c slots costs 2 + min(ceil(c / 8), 3) (dec_item_cost) and block b of B takes the items whose
cost-ordered start lies in [b T / B, (b + 1) T / B) (dec_range_cost). A block stages a group's
rows when its walk enters the group: count rows of K / 8 pieces. The routes are this script's
(seeded Python random), not the bench's, so the counts are the model's.

Usage: stage_model.py [SEED ...]   (default seeds 1 2 3). No GPU, no dependencies.
"""
import bisect
import random
import sys

PACK_DEC = 24


def model(seed, tokens=784, experts=512, topk=10, blocks=132):
    rng = random.Random(seed)
    count = [0] * experts
    for _ in range(tokens):
        for e in rng.sample(range(experts), topk):
            count[e] += 1
    groups = []
    for c in count:
        while c > 0:
            groups.append(min(c, PACK_DEC))
            c -= PACK_DEC
    out = {}
    for name, tbx, k in (("W13", 5, 2560), ("W2", 10, 640)):
        starts, owner, s = [], [], 0
        for gi, c in enumerate(groups):
            cost = 2 + min((c + 7) // 8, 3)
            for _ in range(tbx):
                starts.append(s)
                owner.append(gi)
                s += cost
        total = s
        stagings = pieces = 0
        for b in range(blocks):
            i0 = bisect.bisect_left(starts, total * b // blocks)
            i1 = bisect.bisect_left(starts, total * (b + 1) // blocks)
            prev = None
            for i in range(i0, i1):
                if owner[i] != prev:
                    prev = owner[i]
                    stagings += 1
                    pieces += groups[prev] * k // 8
        out[name] = (len(groups), stagings, pieces)
    return out


def main(argv):
    seeds = [int(a) for a in argv[1:]] or [1, 2, 3]
    print("seed  matrix  groups  stagings  pieces")
    for seed in seeds:
        for name, (g, st, pc) in model(seed).items():
            print(f"{seed:4d}  {name:6s}  {g:6d}  {st:8d}  {pc:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
