#!/usr/bin/env python3
"""placement_search.py - the fewest integer instructions per 32-bit word that decode NVFP4 codes
to the decode kernel's A operands, over every placement of a word's eight codes.

A word holds eight E2M1 codes (a sign and three magnitude bits each); register J (0..3) of the
mma A fragment takes code J in its low half and code J + 4 in its high half. The target bits of
a half are the magnitude bits at M..M+2 and the sign at bit 15: M = 9 for FP16 (e2m1 x 2^-14)
and M = 6 for BF16 (e2m1 x 2^-126), docs/cuda.md. A register's decode is one of:

  and        the bits already in place, one AND with the mask                      1 instruction
  rot B      a rotation (a funnel shift of the word with itself) by B, then AND     2
  mul A C    AND, IMAD by 2^A + 2^C (magnitudes move up by A, the sign by C), AND   3
  shr R mul  a shift right by R first, then `mul A C`                                4

A placement is four such decodes whose source bits partition the 32 bits of the word; `mul`
candidates are kept only where every one of the 256 values of the register's eight bits
decodes exactly (no carry from the stray copies into a kept bit). The script prints the fewest
instructions per word for each format and the decodes that reach it. No GPU, no dependencies.
"""
import sys


def targets(m):
    low = [m, m + 1, m + 2, 15]
    return low + [t + 16 for t in low]


def mul_ok(src, tgt, a, c, pre_shift):
    """every value of the 8 source bits decodes exactly"""
    keep = sum(1 << t for t in tgt)
    for v in range(256):
        w = 0
        for i, s in enumerate(src):
            if v >> i & 1:
                w |= 1 << s
        w >>= pre_shift
        p = (w * ((1 << a) + (1 << c))) & 0xFFFFFFFF
        want = 0
        for i, t in enumerate(tgt):
            if v >> i & 1:
                want |= 1 << t
        if p & keep != want:
            return False
    return True


def candidates(m):
    tgt = targets(m)
    out = []
    for b in range(32):
        src = frozenset((t - b) % 32 for t in tgt)
        out.append((1 if b == 0 else 2, src, "and" if b == 0 else "rot %d" % b))
    for r in range(0, 16):
        for a in range(32):
            for c in range(32):
                if a == c:
                    continue
                low = [m - a + r, m + 1 - a + r, m + 2 - a + r, 15 - c + r]
                src = low + [s + 16 for s in low]
                if min(low) < r or max(src) > 31:
                    continue
                if len(set(src)) != 8 or not mul_ok(src, tgt, a, c, r):
                    continue
                name = "mul %d %d" % (a, c) if r == 0 else "shr %d mul %d %d" % (r, a, c)
                out.append((3 if r == 0 else 4, frozenset(src), name))
    return out


def best(m):
    """exact cover of the 32 bits by four candidates, the cheapest decode per source set"""
    cheapest = {}
    for cost, src, name in candidates(m):
        if src not in cheapest or cost < cheapest[src][0]:
            cheapest[src] = (cost, name)
    by_bit = {b: [s for s in cheapest if b in s] for b in range(32)}
    found = [None]

    def cover(used, chosen, cost):
        if found[0] is not None and cost >= found[0][0]:
            return
        if len(used) == 32:
            found[0] = (cost, [cheapest[s][1] for s in chosen])
            return
        low = min(b for b in range(32) if b not in used)
        for s in by_bit[low]:
            if not used & s:
                cover(used | s, chosen + [s], cost + cheapest[s][0])

    cover(frozenset(), [], 0)
    return found[0]


def main():
    rc = 0
    for name, m in (("FP16", 9), ("BF16", 6)):
        f = best(m)
        if f is None:
            print("%s: no placement decodes with these instructions" % name)
            rc = 1
        else:
            print("%s: %d instructions per word (%s)" % (name, f[0], ", ".join(f[1])))
    return rc


if __name__ == "__main__":
    sys.exit(main())
