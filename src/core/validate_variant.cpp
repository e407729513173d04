#include "core/validate_variant.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "core/backends.hpp"
#include "core/check_tensor.hpp"
#include "core/fail.hpp"
#include "tileattn/error.hpp"

namespace tileattn {
namespace {

// The view, dtype and device of one of the mask's int32 tensors.
void check_int_tensor(const char* fn, const char* name, const TensorView& t, int ndim, const Device& dev) {
  const std::string full = "block_mask." + std::string(name);
  check_tensor(fn, full.c_str(), t, ndim, true);
  check_dtype(fn, full.c_str(), t, DType::i32);
  check_same_device(fn, full.c_str(), t, dev);
}

// The dense element mask of the partial blocks: u8 [1 or batch, 1 or heads_q, rows, cols], any
// strides, rows and cols the sequences' lengths (varlen: at least the longest).
void check_dense_mask(const char* fn, const TensorView& t, const Device& dev, Problem& p) {
  check_tensor(fn, "block_mask.mask", t, 4, true);
  check_dtype(fn, "block_mask.mask", t, DType::u8);
  check_same_device(fn, "block_mask.mask", t, dev);
  const std::int64_t B = t.shape[0], H = t.shape[1], rows = t.shape[2], cols = t.shape[3];
  const bool lengths_ok = p.varlen ? rows >= p.seqlen_q && cols >= p.seqlen_k : rows == p.seqlen_q && cols == p.seqlen_k;
  if ((B != 1 && B != p.batch) || (H != 1 && H != p.heads_q) || !lengths_ok) {
    if (p.varlen)
      fail(fn, "block_mask.mask has shape ", shape_str(t), ", expected [1 or batch = ", p.batch, ", 1 or heads_q = ", p.heads_q,
           ", >= ", p.seqlen_q, ", >= ", p.seqlen_k, "] (the longest query and key sequences: positions within a sequence)");
    fail(fn, "block_mask.mask has shape ", shape_str(t), ", expected [1 or batch = ", p.batch, ", 1 or heads_q = ", p.heads_q,
         ", seqlen_q = ", p.seqlen_q, ", seqlen_k = ", p.seqlen_k, "]");
  }
  p.dense_mask = true;
}

// A host copy of a device-resident int32 tensor (row-major), and its view.
struct HostCopy {
  std::vector<std::int32_t> values;
  TensorView view;
};

HostCopy host_copy(const TensorView& t) {
  HostCopy c;
  if (!t.present()) return c;
#if defined(TILEATTN_WITH_CUDA)
  c.values = cuda::read_i32(t);
#endif
  c.view = t;
  c.view.data = c.values.data();
  c.view.device = Device{};
  std::int64_t step = 1;
  for (int d = t.ndim - 1; d >= 0; step *= t.shape[d], --d) c.view.stride[d] = step;
  return c;
}

std::int32_t at(const TensorView& t, std::int64_t b, std::int64_t h, std::int64_t q, std::int64_t n = 0) {
  return t.ptr<const std::int32_t>()[b * t.stride[0] + h * t.stride[1] + q * t.stride[2] + (t.ndim == 4 ? n * t.stride[3] : 0)];
}

// The masks prefix-LM extends: a right edge to extend (causal or window_right; one past every key
// makes the prefix a no-op, as it makes the window one), rows' ranges from
// key 0 (no left window, no chunk) so that the prefix and the rest stay one range. `what` names
// the prefix argument in the message.
void check_prefix_mask(const char* fn, const std::string& what, const Options& o, const Problem& p) {
  if (!o.causal && o.window_right < 0)
    fail(fn, "prefix-LM (", what, ") needs a mask beyond the prefix, options.causal = true or window_right >= 0 (got causal = ",
         o.causal ? "true" : "false", ", window_right = ", o.window_right, "): without one every key is visible already");
  if (p.window_left >= 0)
    fail(fn, "prefix-LM (", what, ") cannot be combined with options.window_left = ", o.window_left,
         ": a row would see the prefix and a window apart from it");
  if (p.chunk > 0)
    fail(fn, "prefix-LM (", what, ") cannot be combined with options.chunk_size = ", o.chunk_size);
}

}  // namespace

void check_variant_options(const char* fn, const Options& o, Problem& p) {
  if (o.chunk_size < 0) fail(fn, "options.chunk_size = ", o.chunk_size, ", expected >= 0 (0 = off)");
  // A chunk at least as long as both sequences puts every non-negative position in chunk 0 and
  // every negative one (rows above the first key, bottom-right) in chunk -1, as any longer chunk
  // does: capping it keeps the chunk arithmetic within int.
  p.chunk = o.chunk_size == 0 ? 0 : std::min(o.chunk_size, std::max({1, p.seqlen_q, p.seqlen_k}));
  if (o.prefix_len < 0) fail(fn, "options.prefix_len = ", o.prefix_len, ", expected >= 0 (0 = off)");
  if (o.prefix_len > 0) check_prefix_mask(fn, "options.prefix_len = " + std::to_string(o.prefix_len), o, p);
  p.prefix_len = o.prefix_len;
}

void check_prefix_lens(const char* fn, const TensorView& t, const Options& o, const Device& dev, Problem& p) {
  if (!t.present()) return;
  if (o.prefix_len != 0)
    fail(fn, "options.prefix_len = ", o.prefix_len, " and prefix_lens are both given: pass one (per call or per sequence)");
  if (t.ndim != 1 || t.shape[0] != p.batch)
    fail(fn, "prefix_lens has shape ", shape_str(t), ", expected [", p.batch, "] (batch)");
  check_tensor(fn, "prefix_lens", t, 1, true);  // its stride's byte extent
  check_dtype(fn, "prefix_lens", t, DType::i32);
  check_same_device(fn, "prefix_lens", t, dev);
  check_prefix_mask(fn, "prefix_lens", o, p);
  p.prefix_per_seq = true;
  // Device-resident lengths are copied here where options.check_device_indices (one
  // synchronization); otherwise the kernels take a negative length as 0.
  if (dev.type != DeviceType::cpu && (!o.check_device_indices || !cuda_available())) return;
  HostCopy copy;
  const TensorView* lens = &t;
  if (dev.type != DeviceType::cpu) {
    copy = host_copy(t);
    lens = &copy.view;
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int32_t n = lens->ptr<const std::int32_t>()[b * lens->stride[0]];
    if (n < 0) fail(fn, "prefix_lens[", b, "] = ", n, " is negative");
  }
}

void check_documents(const char* fn, const TensorView& ids_q, const TensorView& ids_k, const Device& dev,
                     std::int64_t total_q, std::int64_t total_k, Problem& p) {
  if (!ids_q.present() && !ids_k.present()) return;
  if (!ids_q.present() || !ids_k.present())
    fail(fn, "document_ids_q and document_ids_k must be given together (",
         ids_q.present() ? "document_ids_k" : "document_ids_q", " is absent)");
  auto check = [&](const char* name, const TensorView& t, std::int64_t rows, std::int64_t cols) {
    const int ndim = p.varlen ? 1 : 2;
    const bool shape_ok = t.ndim == ndim && (p.varlen ? t.shape[0] == cols : t.shape[0] == rows && t.shape[1] == cols);
    if (!shape_ok) {
      if (p.varlen) fail(fn, name, " has shape ", shape_str(t), ", expected [", cols, "] (the packed tokens)");
      fail(fn, name, " has shape ", shape_str(t), ", expected [", rows, ", ", cols, "] (batch, seqlen)");
    }
    check_tensor(fn, name, t, ndim, true);  // the strides' byte extent
    check_dtype(fn, name, t, DType::i32);
    check_same_device(fn, name, t, dev);
  };
  check("document_ids_q", ids_q, p.batch, p.varlen ? total_q : p.seqlen_q);
  check("document_ids_k", ids_k, p.batch, p.varlen ? total_k : p.seqlen_k);
  p.documents = true;
}

void check_block_mask(const char* fn, const BlockMask& m, const Device& dev, bool read_device, Problem& p) {
  const bool any = m.kv_num_blocks.present() || m.kv_indices.present() || m.full_kv_num_blocks.present() ||
                   m.full_kv_indices.present() || m.mask.present();
  if (!any) return;
  if (m.mask.present() && !m.kv_num_blocks.present() && !m.kv_indices.present())
    fail(fn, "block_mask.mask is given without block_mask.kv_num_blocks and block_mask.kv_indices: the dense mask is the "
         "element mask of the partly visible blocks a block mask lists (list every block as partial to apply it everywhere)");
  if (!m.kv_num_blocks.present() || !m.kv_indices.present())
    fail(fn, "block_mask.kv_num_blocks and block_mask.kv_indices must be given together (",
         m.kv_num_blocks.present() ? "kv_indices" : "kv_num_blocks", " is absent)");
  const bool full = m.full_kv_num_blocks.present() || m.full_kv_indices.present();
  if (full && !(m.full_kv_num_blocks.present() && m.full_kv_indices.present()))
    fail(fn, "block_mask.full_kv_num_blocks and block_mask.full_kv_indices must be given together (",
         m.full_kv_num_blocks.present() ? "full_kv_indices" : "full_kv_num_blocks", " is absent)");
  if (m.block_q < 16 || m.block_q % 16 != 0 || m.block_k < 16 || m.block_k % 16 != 0)
    fail(fn, "block_mask.block_q = ", m.block_q, ", block_mask.block_k = ", m.block_k,
         ", block sizes must be positive multiples of 16");
  const std::int64_t qblocks = (static_cast<std::int64_t>(p.seqlen_q) + m.block_q - 1) / m.block_q;
  const std::int64_t kblocks = (static_cast<std::int64_t>(p.seqlen_k) + m.block_k - 1) / m.block_k;

  check_int_tensor(fn, "kv_num_blocks", m.kv_num_blocks, 3, dev);
  const TensorView& num = m.kv_num_blocks;
  const std::int64_t B = num.shape[0], H = num.shape[1];
  if ((B != 1 && B != p.batch) || (H != 1 && H != p.heads_q) || num.shape[2] < qblocks)
    fail(fn, "block_mask.kv_num_blocks has shape ", shape_str(num), ", expected [1 or batch = ", p.batch,
         ", 1 or heads_q = ", p.heads_q, ", >= ", qblocks, "] (query blocks: ceil(", p.seqlen_q, " / block_q = ",
         m.block_q, "))");
  auto check_indices = [&](const char* name, const TensorView& idx, const char* num_name, const TensorView& n) {
    check_int_tensor(fn, name, idx, 4, dev);
    if (idx.shape[0] != n.shape[0] || idx.shape[1] != n.shape[1] || idx.shape[2] != n.shape[2])
      fail(fn, "block_mask.", name, " has shape ", shape_str(idx), ", its first three dimensions must match block_mask.",
           num_name, "'s ", shape_str(n));
  };
  check_indices("kv_indices", m.kv_indices, "kv_num_blocks", num);
  if (full) {
    check_int_tensor(fn, "full_kv_num_blocks", m.full_kv_num_blocks, 3, dev);
    if (m.full_kv_num_blocks.shape[0] != B || m.full_kv_num_blocks.shape[1] != H ||
        m.full_kv_num_blocks.shape[2] != num.shape[2])
      fail(fn, "block_mask.full_kv_num_blocks has shape ", shape_str(m.full_kv_num_blocks),
           ", expected block_mask.kv_num_blocks's ", shape_str(num));
    check_indices("full_kv_indices", m.full_kv_indices, "full_kv_num_blocks", m.full_kv_num_blocks);
  }
  if (m.mask.present()) check_dense_mask(fn, m.mask, dev, p);
  p.block_q = m.block_q;
  p.block_k = m.block_k;
  // Device-resident values are copied here where read_device (options.check_device_indices: one
  // synchronization); otherwise the kernels ignore counts and indices out of range.
  if (dev.type != DeviceType::cpu && (!read_device || !cuda_available())) return;
  HostCopy copies[4];
  const BlockMask* values = &m;
  BlockMask host;
  if (dev.type != DeviceType::cpu) {
    const TensorView* all[4] = {&m.kv_num_blocks, &m.kv_indices, &m.full_kv_num_blocks, &m.full_kv_indices};
    for (int i = 0; i < 4; ++i) copies[i] = host_copy(*all[i]);
    host = m;
    host.kv_num_blocks = copies[0].view;
    host.kv_indices = copies[1].view;
    host.full_kv_num_blocks = copies[2].view;
    host.full_kv_indices = copies[3].view;
    values = &host;
  }

  // Per row of the mask: counts within the list and the key blocks, indices in range, each key
  // block at most once across both lists.
  std::vector<std::int64_t> seen(static_cast<std::size_t>(kblocks), -1);
  std::int64_t row_id = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t q = 0; q < qblocks; ++q, ++row_id) {
        auto walk = [&](const char* num_name, const TensorView& n, const char* idx_name, const TensorView& idx) {
          const std::int64_t count = at(n, b, h, q);
          if (count < 0 || count > idx.shape[3] || count > kblocks)
            fail(fn, "block_mask.", num_name, "[", b, ", ", h, ", ", q, "] = ", count, ", expected 0 <= count <= ",
                 std::min(idx.shape[3], kblocks), " (block_mask.", idx_name, ".shape[3] = ", idx.shape[3], ", ", kblocks,
                 " key blocks: ceil(", p.seqlen_k, " / block_k = ", p.block_k, "))");
          for (std::int64_t e = 0; e < count; ++e) {
            const std::int64_t kb = at(idx, b, h, q, e);
            if (kb < 0 || kb >= kblocks)
              fail(fn, "block_mask.", idx_name, "[", b, ", ", h, ", ", q, ", ", e, "] = ", kb, " is outside [0, ", kblocks,
                   ") (key blocks: ceil(", p.seqlen_k, " / block_k = ", p.block_k, "))");
            if (seen[kb] == row_id)
              fail(fn, "block_mask: key block ", kb, " appears twice in row [", b, ", ", h, ", ", q,
                   "] of kv_indices and full_kv_indices (", idx_name, "[..., ", e, "])");
            seen[kb] = row_id;
          }
        };
        walk("kv_num_blocks", values->kv_num_blocks, "kv_indices", values->kv_indices);
        if (full) walk("full_kv_num_blocks", values->full_kv_num_blocks, "full_kv_indices", values->full_kv_indices);
      }
}

}  // namespace tileattn
