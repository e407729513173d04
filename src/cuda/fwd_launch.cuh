// Tile shapes per head dim and the launch of the forward kernel; included by the generated
// instantiation units only.
#pragma once

#include <string>
#include <type_traits>

#include <cutlass/numeric_types.h>

#include "cuda/element.cuh"
#include "cuda/fwd_kernel.cuh"
#include "cuda/fwd_kernel_sm90.cuh"
#include "cuda/fwd_launch.hpp"
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

// Hopper: 64 query rows per warpgroup. Key tiles as wide as the registers allow: the S accumulators
// (block_n / 2 per thread) sit beside O's (head_dim / 2). Head dim 64 runs the portable kernel,
// which beat every wgmma variant there (two warpgroups per block: 0.76-0.99x FlashAttention-2; one
// per block, two blocks per SM: 0.79-1.06x, 5% behind the portable kernel at 8k-16k keys and 10-30%
// at 512; bench/notes/forward.md).
template <class E, int D> struct FwdConfigSm90 { using type = void; };
template <class E> struct FwdConfigSm90<E, 96> { using type = FwdTraitsSm90<E, 96, 128, 128>; };
template <class E> struct FwdConfigSm90<E, 128> { using type = FwdTraitsSm90<E, 128, 128, 128>; };
template <class E> struct FwdConfigSm90<E, 192> { using type = FwdTraitsSm90<E, 192, 128, 96>; };
template <class E> struct FwdConfigSm90<E, 256> { using type = FwdTraitsSm90<E, 256, 128, 64>; };

inline void throw_on(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("tileattn::forward: ") + what + ": " + cudaGetErrorString(e));
}

template <class T, class Kernel>
void launch_kernel(Kernel kernel, const FwdParams& p, const FwdGrid& g) {
  if (T::kSmemBytes > 48 * 1024)
    throw_on(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmemBytes),
             "raising the kernel's shared-memory limit");
  const dim3 grid((g.max_seqlen_q + T::kBlockM - 1) / T::kBlockM, g.batch, g.heads_q);
  kernel<<<grid, T::kThreads, T::kSmemBytes, g.stream>>>(p);
  throw_on(cudaGetLastError(), "launching the forward kernel");
}

// The modifiers' kernel keeps its column checks: it is not the one that must be fast.
template <class T, template <class, bool, bool> class Kernel>
void launch_variant(const FwdParams& p, const FwdGrid& g) {
  if (g.mods)
    launch_kernel<T>(Kernel<T, true, false>::fn, p, g);
  else if (p.d_qk == T::kHeadDim && p.d_v == T::kHeadDim)
    launch_kernel<T>(Kernel<T, false, true>::fn, p, g);
  else
    launch_kernel<T>(Kernel<T, false, false>::fn, p, g);
}

template <class T, bool kMods, bool kEvenK> struct Portable { static constexpr auto fn = fwd_kernel<T, kMods, kEvenK>; };
template <class T, bool kMods, bool kEvenK> struct Hopper { static constexpr auto fn = fwd_kernel_sm90<T, kMods, kEvenK>; };

template <DType kDtype, int kHeadDim>
void launch_fwd(const FwdParams& p, const FwdGrid& g) {
  using E = typename ElementOf<kDtype>::type;
#ifdef TILEATTN_CUDA_SM90A
  using H = typename FwdConfigSm90<E, kHeadDim>::type;
  if constexpr (!std::is_void_v<H>) {
    if (g.sm90a) return launch_variant<H, Hopper>(p, g);
  }
#endif
  launch_variant<typename FwdConfig<E, kHeadDim>::type, Portable>(p, g);
}

}  // namespace tileattn::cuda
