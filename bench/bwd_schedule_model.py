#!/usr/bin/env python3
"""A model of how the Hopper backward's blocks fill the SMs under a causal mask, to choose a launch
order before spending GPU time on it. Blocks start in launch order on whichever SM frees first (one
block an SM); a block's time is its query tiles, the diagonal's masked tiles at (1 + masked) each,
plus `fixed` tiles for its prologue and epilogue. Prints the SMs' busy share (total work over SMs x
makespan) for each order: "in turn" is each (sequence, head) pair's key blocks in turn (key block 0, the
longest, first), "group G" key block by key block over groups of G pairs ("SMs": as many pairs as
SMs over key blocks, the pairs whose blocks run together in the first order), "longest" all blocks
sorted. A grouped-query block walks every query head of its KV head: its time scales, the shares do not.

    bwd_schedule_model.py [--sms 132] [--masked 0.3] [--fixed 1]
"""
import argparse
import heapq

SHAPES = [  # seqlen, key block, query tile, batch, (sequence, KV head) pairs a batch entry
    (512, 96, 64, 32, 16), (2048, 96, 64, 8, 16), (8192, 96, 64, 2, 16), (16384, 96, 64, 1, 16),  # 192/128
    (2048, 96, 64, 8, 4),  # 192/128, 16 query heads on 4 KV heads
    (512, 128, 64, 32, 16), (2048, 128, 64, 8, 16), (8192, 128, 64, 2, 16),  # 128
    (512, 128, 64, 32, 4), (2048, 128, 64, 8, 4), (2048, 128, 64, 8, 8),  # 128, 32 query heads on 4 and 8
    (2048, 128, 128, 8, 32)]  # 64


def busy(durations, sms):
    free = [0.0] * sms
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return sum(durations) / (sms * max(free))


def block_time(seqlen, bn, bm, n, masked, fixed):
    first, last = n * bn // bm, (min((n + 1) * bn, seqlen) - 1) // bm  # query tiles at the diagonal
    return seqlen // bm - first + masked * (last - first + 1) + fixed


def order(keys, pairs, group):
    for first in range(0, pairs, group):
        for n in range(keys):
            for _ in range(min(group, pairs - first)):
                yield n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--masked", type=float, default=0.3, help="a masked tile's extra time, in tiles")
    ap.add_argument("--fixed", type=float, default=1.0, help="a block's prologue and epilogue, in tiles")
    args = ap.parse_args()
    groups = (1, 2, 4, 8, 16)
    print("seqlen key_block q_tile pairs |  in turn " + " ".join(f"group {g:<2}" for g in groups[1:])
          + "      SMs  longest")
    for seqlen, bn, bm, batch, heads in SHAPES:
        keys, pairs = (seqlen + bn - 1) // bn, batch * heads
        t = [block_time(seqlen, bn, bm, n, args.masked, args.fixed) for n in range(keys)]
        shares = [busy([t[n] for n in order(keys, pairs, g)], args.sms)
                  for g in groups + (max(1, args.sms // keys),)]
        shares.append(busy(sorted((t[n] for n in order(keys, pairs, 1)), reverse=True), args.sms))
        print(f"{seqlen:6} {bn:9} {bm:6} {pairs:5} | " + " ".join(f"{s:8.3f}" for s in shares))


if __name__ == "__main__":
    main()
