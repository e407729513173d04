// Tile shapes per head dim and the launch of the forward kernel; included by the generated
// instantiation units only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include <cutlass/numeric_types.h>

#include "cuda/dependent_launch.cuh"
#include "cuda/element.cuh"
#include "cuda/fwd_kernel.cuh"
#include "cuda/fwd_kernel_sm90.cuh"
#include "cuda/fwd_launch.hpp"
#include "cuda/runtime.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {

// (block_m, block_n, warps) per head dim, picked by timing variants side by side on an H100
// (bench/notes/forward.md). hdim 64: a 64-key tile keeps the accumulators in registers without
// spills (128 keys spilled and ran 3-8% slower). hdim 256: a 64-row query tile on 4 warps (16 rows
// each) beat 128 rows on 8 warps on most rows, also without spills. hdim 128 keeps 128 x 64: 128 x 32,
// 8 warps and a 3-blocks-per-SM register cap were all slower.
template <class E, int D> struct FwdConfig;
template <class E> struct FwdConfig<E, 64> { using type = FwdTraits<E, 64, 128, 64, 4>; };
template <class E> struct FwdConfig<E, 96> { using type = FwdTraits<E, 96, 128, 64, 4>; };
template <class E> struct FwdConfig<E, 128> { using type = FwdTraits<E, 128, 128, 64, 4>; };
template <class E> struct FwdConfig<E, 192> { using type = FwdTraits<E, 192, 128, 64, 8>; };
template <class E> struct FwdConfig<E, 256> { using type = FwdTraits<E, 256, 64, 64, 4>; };
// Hopper: 128 query rows (two consumer warpgroups) and two stages of K and V; key tiles as wide as
// registers and shared memory allow: the S accumulators (block_n / 2 per thread) sit beside O's
// (head_dim / 2). At head dim 128, 176-key tiles or three stages (either leaves O no buffer of its
// own) measured slower on nearly every row (bench/notes/forward.md).
// narrow_v: where there is one, the plain calls' kernel for a V head dim up to its kHeadDimV.
template <class T> struct FwdConfigSm90Of { using type = T; using narrow_v = void; };
template <class E, int D> struct FwdConfigSm90;
template <class E> struct FwdConfigSm90<E, 64> : FwdConfigSm90Of<FwdTraitsSm90<E, 64, 128>> {};
template <class E> struct FwdConfigSm90<E, 96> : FwdConfigSm90Of<FwdTraitsSm90<E, 96, 128>> {};
template <class E> struct FwdConfigSm90<E, 128> : FwdConfigSm90Of<FwdTraitsSm90<E, 128, 128>> {};
template <class E> struct FwdConfigSm90<E, 192> {
  using type = FwdTraitsSm90<E, 192, 112>;
  using narrow_v = FwdTraitsSm90<E, 192, 112, 128, 2, 128>;  // 192/128 (qk/v): 128-column V and O
};
template <class E> struct FwdConfigSm90<E, 256> : FwdConfigSm90Of<FwdTraitsSm90<E, 256, 80>> {};
// Head dim 64 with long sequences: three consumer warpgroups (192 query rows). Measured 5-9%
// faster from 2k keys without a mask and from 8k with one; shorter, the last tile's unused rows
// and the wider tiles across the diagonal cost more than the third warpgroup gains
// (bench/notes/forward.md).
template <class E, int D> struct FwdConfigSm90Tall { using type = void; };
template <class E> struct FwdConfigSm90Tall<E, 64> { using type = FwdTraitsSm90<E, 64, 128, 192>; };

inline void throw_on(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("tileattn::forward: ") + what + ": " + cudaGetErrorString(e));
}

template <class T, class Kernel>
void launch_kernel(Kernel kernel, const FwdParams& p, const FwdGrid& g) {
  raise_smem_limit(reinterpret_cast<const void*>(kernel), T::kSmemBytes,
                   "cudaFuncSetAttribute (raising the forward kernel's shared-memory limit)");
  const dim3 grid((g.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, g.batch, g.heads_q);
  kernel<<<grid, T::kThreads, T::kSmemBytes, g.stream>>>(p);
  throw_on(cudaGetLastError(), "launching the forward kernel");
}

// The modifiers' kernel keeps its column checks: it is not the one that must be fast.
template <class T, bool kVariant>
void launch_portable_as(const FwdParams& p, const FwdGrid& g) {
  if (g.mods)
    launch_kernel<T>(fwd_kernel<T, true, false, kVariant>, p, g);
  else if (p.d_qk == T::kHeadDim && p.d_v == T::kHeadDim)
    launch_kernel<T>(fwd_kernel<T, false, true, kVariant>, p, g);
  else
    launch_kernel<T>(fwd_kernel<T, false, false, kVariant>, p, g);
}

template <class T>
void launch_portable(const FwdParams& p, const FwdGrid& g) {
  g.variant ? launch_portable_as<T, true>(p, g) : launch_portable_as<T, false>(p, g);
}

// One persistent block per SM but the margin's (fewer when there are fewer tiles); TMA needs no
// column checks.
template <class T, bool kMods, bool kVariant>
void launch_sm90_as(const FwdParams& p, const FwdGrid& g) {
  auto kernel = fwd_kernel_sm90<T, kMods, kVariant>;
  raise_smem_limit(reinterpret_cast<const void*>(kernel), T::kSmemBytes,
                   "cudaFuncSetAttribute (raising the forward kernel's shared-memory limit)");
  const FwdTmaSm90<T> tma = make_fwd_tma<T>(p, g.batch);
  const int m_blocks = (g.max_seqlen_q + T::kBlockM - 1) / T::kBlockM;
  const TileScheduler sched{m_blocks, g.heads_q, m_blocks * g.batch * g.heads_q, g.tile_counter};
  const int sms = std::max(1, device_sm_count() - g.sm_margin);
  const int grid = sched.num_tiles < sms ? sched.num_tiles : sms;
  if (g.tile_counter != nullptr) {
    launch_after_clearing(g.tile_counter, 1, false, kernel, dim3(grid), dim3(T::kThreads), T::kSmemBytes, g.stream, p, tma,
                          sched);
    return;
  }
  kernel<<<grid, T::kThreads, T::kSmemBytes, g.stream>>>(p, tma, sched);
  throw_on(cudaGetLastError(), "launching the forward kernel");
}

template <class T>
void launch_sm90(const FwdParams& p, const FwdGrid& g) {
  if (g.variant) return g.mods ? launch_sm90_as<T, true, true>(p, g) : launch_sm90_as<T, false, true>(p, g);
  g.mods ? launch_sm90_as<T, true, false>(p, g) : launch_sm90_as<T, false, false>(p, g);
}

// Whether a kernel's tiles lie within the block mask's blocks (each tile meets one cell).
template <class T>
bool tiles_fit_blocks(const FwdGrid& g) {
  return g.block_q % T::kBlockM == 0 && g.block_k % T::kBlockN == 0;
}

template <DType kDtype, int kHeadDim>
void launch_fwd(const FwdParams& p, const FwdGrid& g) {
  using E = typename ElementOf<kDtype>::type;
#ifdef TILEATTN_CUDA_SM90A
  using H = typename FwdConfigSm90<E, kHeadDim>::type;
  using Tall = typename FwdConfigSm90Tall<E, kHeadDim>::type;
  if constexpr (!std::is_void_v<Tall>) {
    const bool masked = g.tile_counter != nullptr;  // a mask or varlen: the tiles differ in cost
    if (g.sm90a && g.max_seqlen_q >= (masked ? 8192 : 2048) && tiles_fit_blocks<Tall>(g)) return launch_sm90<Tall>(p, g);
  }
  using HV = typename FwdConfigSm90<E, kHeadDim>::narrow_v;
  if constexpr (!std::is_void_v<HV>) {
    if (g.sm90a && !g.mods && !g.variant && p.d_v <= HV::kHeadDimV) return launch_sm90_as<HV, false, false>(p, g);
  }
  if (g.sm90a && tiles_fit_blocks<H>(g)) return launch_sm90<H>(p, g);
#endif
  launch_portable<typename FwdConfig<E, kHeadDim>::type>(p, g);
}

}  // namespace tileattn::cuda
