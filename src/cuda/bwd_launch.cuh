// Tile shapes per head dim and the launches of the backward kernels; included by the generated
// instantiation units only.
#pragma once

#include <type_traits>

#include "cuda/bwd_kernel.cuh"
#include "cuda/bwd_kernel_sm90.cuh"
#include "cuda/bwd_kernel_sm90_wide.cuh"
#include "cuda/element.cuh"
#include "cuda/bwd_launch.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/runtime.hpp"

namespace tileattn::cuda {

// (M, N, warps, warps along keys for S^T, along keys for dK/dV, along queries for dQ, stages), as
// FlashAttention-2 tiles its backward on an H100: 128 x 128 at head dim 64, 64 x 128 up to 128 and
// 64 x 64 beyond, where the dK and dV accumulators alone take 128 registers a thread. Q / dO are
// double-buffered up to head dim 128; beyond, a second stage cost spills and ran 4-12% slower at
// head dim 256 (bench/notes/backward.md), and one stage keeps the kernels within an A100's
// shared memory.
template <class E, int D> struct BwdConfig;
template <class E> struct BwdConfig<E, 64> { using type = BwdTraits<E, 64, 128, 128, 8, 2, 4, 4, 2>; };
template <class E> struct BwdConfig<E, 96> { using type = BwdTraits<E, 96, 64, 128, 8, 4, 4, 4, 2>; };
template <class E> struct BwdConfig<E, 128> { using type = BwdTraits<E, 128, 64, 128, 8, 4, 4, 2, 2>; };
template <class E> struct BwdConfig<E, 192> { using type = BwdTraits<E, 192, 64, 64, 8, 2, 2, 2, 1>; };
template <class E> struct BwdConfig<E, 256> { using type = BwdTraits<E, 256, 64, 64, 8, 2, 2, 2, 1>; };

// Hopper: 128-key tiles (64 keys per warpgroup) up to head dim 128 as FlashAttention-3 tiles them,
// with 128-row query tiles at head dim 64 (half the per-tile overhead where each tile's products are
// short; the modifiers' kernel keeps 64 rows, as the softcap's derivative per element would spill)
// and 64 rows beyond; 64-key tiles shared by two warpgroups past 128. The deterministic mode with
// chunks, document ids, a prefix or a block mask runs the portable kernels.
// narrow_v: where there is one, the plain calls' kernel for a V head dim up to its kHeadDimV.
template <class E, int D> struct BwdConfigSm90 { using type = void; using mods = void; using narrow_v = void; };
template <class E> struct BwdConfigSm90<E, 64> {
  using type = BwdTraitsSm90<E, 64, 128, 128>;
  using mods = BwdTraitsSm90<E, 64, 64, 128>;
  using narrow_v = void;
};
template <class T> struct BwdConfigSm90One {
  using type = T;
  using mods = T;
  using narrow_v = void;
};
template <class E> struct BwdConfigSm90<E, 96> : BwdConfigSm90One<BwdTraitsSm90<E, 96, 64, 128>> {};
template <class E> struct BwdConfigSm90<E, 128> : BwdConfigSm90One<BwdTraitsSm90<E, 128, 64, 128>> {};
// 192/128 (qk/v), as DeepSeek's attention has it: plain calls on 96-key tiles with V and dO tiles of
// 128 columns, not 192, and dK and dV transposed (bwd_kernel_sm90_wide.cuh).
template <class E> struct BwdConfigSm90<E, 192> : BwdConfigSm90One<BwdTraitsSm90<E, 192, 64, 64>> {
  using narrow_v = BwdTraitsSm90Wide<E, 192, 128>;
};
template <class E> struct BwdConfigSm90<E, 256> : BwdConfigSm90One<BwdTraitsSm90<E, 256, 64, 64>> {};

// Whether a call runs the Hopper kernel (else the portable ones), which decides the scratch too:
// every Hopper kernel adds dQ by bulk reductions, whose writer takes turns in the deterministic mode
// (g.sm90a is off for a deterministic variant call).
template <DType kDtype, int kHeadDim>
bool bwd_runs_sm90(const BwdGrid& g) {
#ifdef TILEATTN_CUDA_SM90A
  if constexpr (!std::is_void_v<typename BwdConfigSm90<typename ElementOf<kDtype>::type, kHeadDim>::type>)
    return g.sm90a;
#endif
  return false;
}

template <DType kDtype, int kHeadDim>
int bwd_sm90_key_tile() {
#ifdef TILEATTN_CUDA_SM90A
  using H = typename BwdConfigSm90<typename ElementOf<kDtype>::type, kHeadDim>::type;
  if constexpr (!std::is_void_v<H>) return H::kBlockN;
#endif
  return 0;
}

template <class Kernel>
void launch_kernel(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const BwdParams& p,
                   const char* what) {
  if (grid.x == 0) return;  // no rows on this side (seqlen 0): nothing to write
  raise_smem_limit(reinterpret_cast<const void*>(kernel), smem,
                   "cudaFuncSetAttribute (raising the backward kernel's shared-memory limit)");
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch(what);
}

template <class T, bool kMods, bool kVariant>
void launch_bwd_traits(const BwdParams& p, const BwdGrid& g) {
  const dim3 kv_grid((g.max_seqlen_k + T::kBlockN - 1) / T::kBlockN, g.batch, g.heads_kv);
  if (g.deterministic) {
    launch_kernel(bwd_dkdv_kernel<T, kMods, false, kVariant>, kv_grid, T::kThreads, T::kSmemDkdv, g.stream, p,
                  "launching the backward dK/dV kernel");
    const dim3 q_grid((g.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, g.batch, g.heads_q);
    launch_kernel(bwd_dq_kernel<T, kMods, kVariant>, q_grid, T::kThreads, T::kSmemDq, g.stream, p,
                  "launching the backward dQ kernel");
  } else {
    launch_kernel(bwd_dkdv_kernel<T, kMods, true, kVariant>, kv_grid, T::kThreads, T::kSmemDkdv, g.stream, p,
                  "launching the backward dK/dV kernel");
  }
}

// Hopper: one block per (key tile, sequence, KV head), the TMA descriptors beside the arguments; a
// programmatic dependent of the D kernel where that ran (query rows): otherwise the work before is
// the caller's, whose outputs the prologue may read.
template <class H, class Kernel>
void launch_bwd_sm90_kernel(Kernel kernel, const BwdParams& p, const BwdGrid& g) {
  const dim3 grid((g.max_seqlen_k + H::kBlockN - 1) / H::kBlockN, g.batch, g.heads_kv * p.group_parts);
  if (grid.x == 0) return;
  raise_smem_limit(reinterpret_cast<const void*>(kernel), H::kSmemBytes,
                   "cudaFuncSetAttribute (raising the backward kernel's shared-memory limit)");
  const BwdTmaSm90<H> tma = make_bwd_tma<H>(p, g.batch);
  if (p.rows_total > 0) {
    launch_dependent(kernel, grid, dim3(H::kThreads), H::kSmemBytes, g.stream, p, tma);
    return;
  }
  kernel<<<grid, H::kThreads, H::kSmemBytes, g.stream>>>(p, tma);
  check_launch("launching the backward kernel");
}

template <class H, bool kMods, bool kVariant>
void launch_bwd_sm90(const BwdParams& p, const BwdGrid& g) {
  auto kernel = bwd_kernel_sm90<H, kMods, false, kVariant>;
  if constexpr (!kVariant) {
    if (g.deterministic) kernel = bwd_kernel_sm90<H, kMods, true, false>;
  }
  launch_bwd_sm90_kernel<H>(kernel, p, g);
}

template <DType kDtype, int kHeadDim>
void launch_bwd(const BwdParams& p, const BwdGrid& g) {
  using E = typename ElementOf<kDtype>::type;
#ifdef TILEATTN_CUDA_SM90A
  using H = typename BwdConfigSm90<E, kHeadDim>::type;
  if constexpr (!std::is_void_v<H>) {
    if (bwd_runs_sm90<kDtype, kHeadDim>(g)) {
      // Variants with a plain score take the plain kernel's tiles and code: the modifiers' kernel
      // spills, and at head dim 64 has half the rows per tile.
      using HM = typename BwdConfigSm90<E, kHeadDim>::mods;
      using HV = typename BwdConfigSm90<E, kHeadDim>::narrow_v;
      if (g.variant) return g.mods ? launch_bwd_sm90<HM, true, true>(p, g) : launch_bwd_sm90<H, false, true>(p, g);
      if constexpr (!std::is_void_v<HV>) {
        if (!g.mods && p.fwd.d_v <= HV::kHeadDimV) {
          return g.deterministic ? launch_bwd_sm90_kernel<HV>(bwd_kernel_sm90_wide<HV, true>, p, g)
                                 : launch_bwd_sm90_kernel<HV>(bwd_kernel_sm90_wide<HV, false>, p, g);
        }
      }
      return g.mods ? launch_bwd_sm90<HM, true, false>(p, g) : launch_bwd_sm90<H, false, false>(p, g);
    }
  }
#endif
  using T = typename BwdConfig<E, kHeadDim>::type;
  if (g.variant)
    return g.mods ? launch_bwd_traits<T, true, true>(p, g) : launch_bwd_traits<T, false, true>(p, g);
  if (g.mods)
    launch_bwd_traits<T, true, false>(p, g);
  else
    launch_bwd_traits<T, false, false>(p, g);
}

}  // namespace tileattn::cuda
