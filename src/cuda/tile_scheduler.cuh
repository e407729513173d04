// The work tiles (query tile, sequence, head) of a persistent kernel and the order its blocks take
// them in. The tiles of one head are adjacent, so that the blocks running at one time share their K
// and V through L2, and within a head the tiles with the most keys (the last query tiles under a
// causal mask) come first. Block i starts with tile i; then either takes every gridDim.x-th tile
// (all tiles cost the same) or claims the next unclaimed one from a counter zeroed before the
// launch (masks or varlen make some tiles cheaper: blocks that finish early take more, and the
// running tiles stay together in the order).
#pragma once

namespace tileattn::cuda {

struct TileScheduler {
  int m_blocks;   // query tiles per (sequence, head)
  int heads;      // heads_q
  int num_tiles;  // m_blocks * batch * heads_q
  int* counter;   // tiles claimed past the first wave; nullptr: every gridDim.x-th tile

  struct Tile {
    int m_block, b, h;
  };

  __device__ int first() const { return int(blockIdx.x); }
  __device__ bool valid(int t) const { return t < num_tiles; }
  __device__ int next(int t) const { return counter ? int(gridDim.x) + atomicAdd(counter, 1) : t + int(gridDim.x); }
  __device__ Tile tile(int t) const {
    const int pair = t / m_blocks;
    return {m_blocks - 1 - (t - pair * m_blocks), pair / heads, pair % heads};
  }
};

}  // namespace tileattn::cuda
