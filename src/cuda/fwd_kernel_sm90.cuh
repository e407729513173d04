// The Hopper forward kernel (sm_90a): warp-specialized and persistent. A block holds one SM and
// walks the work tiles the scheduler gives it. Its first warpgroup produces (one thread takes the
// tiles, hands each to the consumers and issues every TMA load, after giving most of its registers
// away); the others consume: each runs the mainloop for its 64 query rows and writes them out,
// while the producer already loads the next tile. The pieces: fwd_sm90_mainloop.cuh,
// fwd_sm90_epilogue.cuh, tile_scheduler.cuh.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include "cuda/dependent_launch.cuh"
#include "cuda/fwd_params.hpp"
#include "cuda/fwd_sm90_epilogue.cuh"
#include "cuda/fwd_sm90_mainloop.cuh"
#include "cuda/fwd_tile.cuh"
#include "cuda/online_softmax.cuh"
#include "cuda/tile_scheduler.cuh"

namespace tileattn::cuda {

using namespace cute;

// kMods, kVariant: as in fwd_kernel.cuh.
template <class T, bool kMods, bool kVariant>
__global__ void __launch_bounds__(T::kThreads, 1)
    fwd_kernel_sm90(const __grid_constant__ FwdParams p, const __grid_constant__ FwdTmaSm90<T> tma,
                    const __grid_constant__ TileScheduler sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename T::Element;
  using Pipeline = typename T::Pipeline;
  extern __shared__ __align__(1024) char smem_sm90[];
  auto& bars = *reinterpret_cast<FwdBarriersSm90<T::kStages>*>(smem_sm90 + T::kOffsetBarriers);
  auto smem = [&](int offset) { return make_smem_ptr(reinterpret_cast<Element*>(smem_sm90 + offset)); };
  Tensor sQ = make_tensor(smem(0), typename T::SmemLayoutQ{});
  Tensor sK = make_tensor(smem(T::kOffsetK), typename T::SmemLayoutKV{});
  Tensor sV = make_tensor(smem(T::kOffsetV), typename T::SmemLayoutV{});
  Tensor sVt = make_tensor(smem(T::kOffsetV), typename T::SmemLayoutVt{});
  Tensor sO = make_tensor(smem(T::kOffsetO), typename T::SmemLayoutO{});  // where kOwnO

  const int warp_group = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  if (threadIdx.x == 0) {
    bars.q_full.init(1);
    bars.q_empty.init(T::kConsumers);
    for (int i = 0; i < 2; ++i) {
      bars.tile_full[i].init(1);
      bars.tile_empty[i].init(T::kConsumers);
    }
    cute::prefetch_tma_descriptor(tma.q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma.k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(tma.v.get_tma_descriptor());
  }
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = T::kConsumers;
  pp.transaction_bytes = T::kTileKVBytes;
  Pipeline pk(bars.k, pp, Shape<_1, _1, _1>{});
  pp.transaction_bytes = T::kTileVBytes;
  Pipeline pv(bars.v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barriers initialized

  int q_loads = 0;  // tiles with keys so far: the phase of Q's barriers
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<T::kProducerRegs>();
    if (threadIdx.x != 0) return;
    if (sched.counter != nullptr) wait_for_primary();  // the counter's clearing
    auto st = cutlass::make_producer_start_state<Pipeline>();
    for (int t = sched.first(), i = 0;; t = sched.next(t), ++i) {
      // Tile i goes through slot i % 2, whose previous tile the consumers have read.
      if (i >= 2) bars.tile_empty[i & 1].wait(((i >> 1) - 1) & 1);
      *static_cast<volatile int*>(&bars.tile[i & 1]) = t;
      asm volatile("" ::: "memory");  // the store stays ahead of the arrive (release)
      bars.tile_full[i & 1].arrive();
      if (!sched.valid(t)) break;
      const auto w = sched.tile(t);
      const FwdTile g = fwd_tile<T::kBlockM, T::kBlockN, kVariant>(p, w.m_block, w.b, w.h);
      if (!g.has_rows() || !g.has_keys<T::kBlockN, kVariant>(p)) continue;
      fwd_sm90_load<T, kVariant>(p, tma, g, sQ, sK, sV, pk, pv, st, bars, q_loads);
      ++q_loads;
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<T::kConsumerRegs>();
    const int tc = int(threadIdx.x) - 128;
    // The first consumer warpgroup takes the first turn at the tensor cores.
    if (warp_group == T::kWarpGroups) cutlass::arch::NamedBarrier::arrive(2 * 128, kBarrierTurn);
    typename T::MmaO mma_o;
    cutlass::PipelineState<T::kStages> st;
    for (int i = 0;; ++i) {
      bars.tile_full[i & 1].wait((i >> 1) & 1);
      asm volatile("" ::: "memory");  // the load stays behind the wait (acquire)
      const int t = *static_cast<volatile int*>(&bars.tile[i & 1]);
      bars.tile_empty[i & 1].arrive();
      if (!sched.valid(t)) break;
      const auto w = sched.tile(t);
      const FwdTile g = fwd_tile<T::kBlockM, T::kBlockN, kVariant>(p, w.m_block, w.b, w.h);
      if (!g.has_rows()) continue;
      if (!g.has_keys<T::kBlockN, kVariant>(p)) {
        fwd_sm90_store_empty<T>(p, g, tc);
        continue;
      }
      Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<T::kBlockM>, Int<T::kHeadDimV>>{});
      Tensor acc_o_rc = make_tensor(acc_o.data(), rowcol(acc_o.layout()));
      constexpr int kRows = decltype(size<0>(acc_o_rc))::value;
      OnlineSoftmax<kRows> softmax;
      clear(acc_o);
      fwd_sm90_mma<T, kMods, kVariant>(p, g, sQ, sK, sV, sVt, pk, pv, st, bars, q_loads & 1, acc_o, softmax, tc);
      ++q_loads;
      float lse[kRows];
      softmax.finish(acc_o_rc, kMods ? 1.f : p.scale_log2, kMods && g.var.dropout ? g.var.drop.keep_scale : 1.f, lse);
      fwd_sm90_store<T>(p, g, acc_o, lse, sO, tc);
    }
  }
#endif
}

}  // namespace tileattn::cuda
