#!/usr/bin/env python3
"""A model of the Hopper backward's deterministic mode under a causal mask, to choose how to split
grouped heads over blocks before spending GPU time on it. Time runs in query tiles. Blocks start
in bwd_block's deterministic launch order (key blocks p.det_chain at a time over every (sequence,
KV head part) pair, last to first) on free SMs, one block an SM; a block walks its heads' visible
query tiles in turn, computing up to `slack` tiles ahead of its dQ writer (the staged dQ buffers),
and the writer adds a tile's dQ only after every later key block that sees the tile has added it.
Prints each split's time, the ideal (all tiles over all SMs) and the speed-up over no split. It
leaves out what a split costs, the parts' additions into fp32 dK, dV rows and their conversion,
which outweighed the shorter tail at 512 tokens when each part had rows of its own
(bench/notes/backward.md).

    bwd_det_model.py [--sms 132] [--slack 2]
"""
import argparse

L2_BYTES = 50 << 20
SHAPES = [  # batch, KV heads, group, seqlen (head dim 128: 128-key blocks, 64-row query tiles)
    (8, 4, 8, 2048), (8, 8, 4, 2048), (32, 4, 8, 512), (32, 8, 4, 512), (8, 16, 1, 2048)]


def launch_order(keys, pairs, chain):
    """(key block, pair) in launch order, as bwd_block<true>."""
    chain = min(chain, keys)
    whole = keys // chain * chain
    for i in range(keys * pairs):
        if i < whole * pairs:
            r = i % (chain * pairs)
            k, yz = i // (chain * pairs) * chain + r % chain, r // chain
        else:
            rest = keys - whole
            r = i - whole * pairs
            k, yz = whole + r % rest, r // rest
        yield keys - 1 - k, yz


def det_chain(seqlen, heads_per_block, hdim=128):
    """backward.cpp's det_chain: 8 where a block's rows fit a fifth of L2, else whole rows."""
    head_bytes = seqlen * heads_per_block * (2 * 2 * hdim + 4 * hdim)
    return 8 if head_bytes * 5 <= L2_BYTES else 1 << 30


def simulate(batch, kv_heads, group, parts, seqlen, sms, slack, bn=128, bm=64):
    keys, tiles = (seqlen + bn - 1) // bn, (seqlen + bm - 1) // bm
    heads = group // parts
    first = [k * bn // bm for k in range(keys)]  # a key block's first visible query tile
    last_key = [min(keys - 1, ((t + 1) * bm - 1) // bn) for t in range(tiles)]  # the first to add
    order = list(launch_order(keys, batch * kv_heads * parts, det_chain(seqlen, heads)))
    added = {}  # (pair, head, tile) -> the key block that added last
    running, started, time = [], 0, 0
    while started < len(order) or running:
        while len(running) < sms and started < len(order):
            k, yz = order[started]
            running.append({"k": k, "yz": yz, "walk": [(h, t) for h in range(heads) for t in range(first[k], tiles)],
                            "added": 0, "ahead": 0})
            started += 1
        time += 1
        adds = []
        for b in running:
            if b["added"] + b["ahead"] < len(b["walk"]) and b["ahead"] < slack:
                b["ahead"] += 1
            if b["ahead"] > 0:
                h, t = b["walk"][b["added"]]
                if added.get((b["yz"], h, t), last_key[t] + 1) - 1 == b["k"]:
                    adds.append(((b["yz"], h, t), b["k"]))
                    b["added"] += 1
                    b["ahead"] -= 1
        added.update(adds)
        running = [b for b in running if b["added"] < len(b["walk"])]
    work = sum(tiles - first[k] for k in range(keys)) * group * batch * kv_heads
    return time, work / sms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--slack", type=int, default=2, help="tiles the consumers run ahead of the writer")
    args = ap.parse_args()
    print("batch heads   seqlen parts |  time  ideal  speed-up")
    for batch, kv_heads, group, seqlen in SHAPES:
        base = None
        for parts in (p for p in (1, 2, 4, 8) if group % p == 0):
            time, ideal = simulate(batch, kv_heads, group, parts, seqlen, args.sms, args.slack)
            base = base or time
            print(f"{batch:5} {group * kv_heads:2}/{kv_heads:<2} {seqlen:6} {parts:5} | {time:5} {ideal:6.0f} "
                  f"{base / time:9.3f}")


if __name__ == "__main__":
    main()
