// Options shared by every attention call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace tileattn {

// Where the causal/window diagonal sits when seqlen_q != seqlen_k.
//  bottom_right: query row i sees key j iff j <= i + seqlen_k - seqlen_q (flash-attn >= 2.1,
//                what decoding and chunked prefill need).
//  top_left:     query row i sees key j iff j <= i (PyTorch's is_causal convention).
enum class MaskAlign : std::uint8_t { bottom_right, top_left };

enum class Backend : std::uint8_t {
  automatic,      // the tensors' device decides: CUDA tensors -> cuda, host tensors -> cpu_flash
  cpu_flash,      // tiled, online-softmax CPU implementation
  cpu_reference,  // fp64, materializes S and P: the test oracle
  cuda,
};

struct Options {
  std::optional<float> scale;  // default 1 / sqrt(head_dim_qk)
  bool causal = false;
  MaskAlign align = MaskAlign::bottom_right;  // applies to causal and to the window
  int window_left = -1;                       // keys at most this far left of the diagonal; -1 = unbounded
  int window_right = -1;                      // keys at most this far right; -1 = unbounded (causal => 0)
  // Chunked-local attention (Llama 4's attention chunks): > 0 = the key axis is cut into chunks of
  // this many keys and a query row sees only keys of the chunk its diagonal position falls in (with
  // the same alignment as causal), intersected with causal and the window. 0 = off.
  int chunk_size = 0;
  // Prefix-LM: > 0 = every query row also sees keys [0, prefix_len) of its sequence, the prompt it
  // attends to in both directions, besides the keys its causal mask lets it see (so it needs causal
  // or window_right >= 0, and takes no window_left or chunk_size). Rows above the first key under
  // bottom-right alignment see the prefix too. Per sequence instead: ForwardArgs::prefix_lens.
  // 0 = off (plain causal). Forward and backward on every backend; decode on the CPU backends only.
  int prefix_len = 0;
  float softcap = 0.f;                        // > 0: score = softcap * tanh(score / softcap)
  // ALiBi's distance for query row i and key j of a sequence: |i + alibi_diagonal - j|. Unset: the
  // causal diagonal's offset (seqlen_k - seqlen_q bottom-right, 0 top-left), flash-attn's rule. Set
  // it where the call's rows and keys are a block of a longer sequence (context parallelism):
  // the query block's first position minus the key block's. Forward and backward only.
  std::optional<int> alibi_diagonal;
  float dropout_p = 0.f;                      // probability of dropping; kept values scaled by 1/(1-p)
  std::uint64_t seed = 0;                     // dropout: Philox key
  std::uint64_t offset = 0;                   // dropout: Philox counter offset
  bool deterministic = false;                 // backward: bitwise reproducible gradients
  Backend backend = Backend::automatic;
  int num_splits = 0;                         // decode: KV splits; 0 = heuristic, 1 = no split
  // cuda backend, forward: SMs the persistent Hopper kernel leaves free for kernels that run beside
  // it, such as context parallelism's transfers, which otherwise find no SM until it ends; it keeps
  // at least one. 0 = every SM. Kernels that are not persistent (backward, decode) ignore it.
  int sm_margin = 0;
  // decode: copy device-resident cache_seqlens and page_table to the host and check them before
  // launch (one synchronization); forward and backward: the same for a device-resident block mask's
  // counts and indices and for prefix_lens. Turn off inside CUDA graph capture and hot loops; the
  // kernels then clamp out-of-range values rather than read outside the cache, ignore out-of-range
  // block entries and take a negative prefix length as 0.
  bool check_device_indices = true;
  // cuda backend: ask the driver where each tensor lies (a pointer query per tensor) and report one
  // that is not in its view's device's memory. A caller whose tensors' devices are certain (PyTorch
  // tensors: the Python package turns it off for them) may skip the queries' host time; a pointer
  // that lies about its device then faults in the kernel instead.
  bool check_residence = true;
  void* stream = nullptr;                     // cudaStream_t for the cuda backend; nullptr = default stream
  void* workspace = nullptr;                  // optional caller-owned scratch (see workspace_size)
  std::size_t workspace_bytes = 0;
};

}  // namespace tileattn
