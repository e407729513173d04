// Every way validation rejects a block mask or an attention chunk, forward and backward: a
// tileattn::Error naming the argument and values, outputs untouched.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "support/expect_rejected.hpp"
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn {
namespace {

using test::HostTensor;

// q [2, 40, 4, 8], k/v [2, 70, 2, 8]: with 16 x 32 blocks, 3 query blocks and 3 key blocks.
struct Problem {
  HostTensor q{DType::f32, {2, 40, 4, 8}}, k{DType::f32, {2, 70, 2, 8}}, v{DType::f32, {2, 70, 2, 8}};
  HostTensor out{DType::f32, {2, 40, 4, 8}}, lse{DType::f32, {2, 4, 40}};
  HostTensor dout{DType::f32, {2, 40, 4, 8}}, dq{DType::f32, {2, 40, 4, 8}}, dk{DType::f32, {2, 70, 2, 8}},
      dv{DType::f32, {2, 70, 2, 8}};
  // A valid mask: every row lists key blocks 0 and 1 as partial and key block 2 as full.
  HostTensor num{DType::i32, {2, 4, 3}}, idx{DType::i32, {2, 4, 3, 2}};
  HostTensor full_num{DType::i32, {2, 4, 3}}, full_idx{DType::i32, {2, 4, 3, 1}}, full_num_b1{DType::i32, {1, 4, 3}};
  HostTensor num_f32{DType::f32, {2, 4, 3}}, num_short{DType::i32, {2, 4, 2}}, num_heads3{DType::i32, {2, 3, 3}};
  HostTensor idx_3d{DType::i32, {2, 4, 3}}, idx_rows{DType::i32, {2, 4, 4, 2}};
  HostTensor docs_q{DType::i32, {2, 40}}, docs_k{DType::i32, {2, 70}}, docs_f32{DType::f32, {2, 70}};
  // Dense element masks: valid [2, 1, 40, 70], and broken ones.
  HostTensor mask{DType::u8, {2, 1, 40, 70}}, mask_f32{DType::f32, {2, 1, 40, 70}}, mask_rows{DType::u8, {2, 1, 41, 70}},
      mask_heads{DType::u8, {2, 3, 40, 70}}, mask_3d{DType::u8, {2, 40, 70}}, mask_t{DType::u8, {2, 1, 40, 70}, {0, 1, 3, 2}};

  Problem() {
    q.fill(0.5);
    k.fill(0.25);
    v.fill(1);
    dout.fill(1);
    num.fill(2);
    for (std::int64_t i = 0; i < idx.numel(); ++i) idx.set(i, i % 2 == 0 ? 0 : 1);
    full_num.fill(1);
    full_idx.fill(2);
    full_num_b1.fill(1);
    num_short.fill(0);
    num_heads3.fill(0);
    idx_rows.fill(0);
    for (std::int64_t i = 0; i < mask.numel(); ++i) mask.set(i, i % 5 != 0);
    poison();
  }
  void poison() {
    out.poison();
    lse.poison();
    dq.poison();
    dk.poison();
    dv.poison();
  }
  ForwardArgs forward_args() const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    a.block_mask.kv_num_blocks = num.view();
    a.block_mask.kv_indices = idx.view();
    a.block_mask.full_kv_num_blocks = full_num.view();
    a.block_mask.full_kv_indices = full_idx.view();
    a.block_mask.block_q = 16;
    a.block_mask.block_k = 32;
    a.options.backend = Backend::cpu_flash;
    return a;
  }
  BackwardArgs backward_args() const {
    const ForwardArgs f = forward_args();
    BackwardArgs a;
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.out = f.out;
    a.lse = f.lse;
    a.dout = dout.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.block_mask = f.block_mask;
    a.options = f.options;
    return a;
  }
};

struct Rejection {
  const char* what;
  std::function<void(BlockMask&, Options&)> mutate;
  std::vector<std::string> fragments;
};

void expect_all_rejected(Problem& pr, const std::vector<Rejection>& cases) {
  for (const Rejection& c : cases) {
    SCOPED_TRACE(c.what);
    ForwardArgs f = pr.forward_args();
    c.mutate(f.block_mask, f.options);
    auto fragments = c.fragments;
    fragments.push_back("tileattn::forward");
    test::expect_rejected([&] { forward(f); }, fragments, {&pr.out, &pr.lse});
    BackwardArgs b = pr.backward_args();
    c.mutate(b.block_mask, b.options);
    fragments.back() = "tileattn::backward";
    test::expect_rejected([&] { backward(b); }, fragments, {&pr.dq, &pr.dk, &pr.dv});
  }
}

TEST(ValidateBlockMask, ValidMaskIsAccepted) {
  Problem pr;
  EXPECT_NO_THROW(forward(pr.forward_args()));
  EXPECT_NO_THROW(backward(pr.backward_args()));
}

TEST(ValidateBlockMask, ShapesDtypesAndSizes) {
  Problem pr;
  expect_all_rejected(pr, {
      {"indices without counts", [](BlockMask& m, Options&) { m.kv_num_blocks = {}; },
       {"kv_num_blocks and block_mask.kv_indices must be given together", "kv_num_blocks is absent"}},
      {"counts without indices", [](BlockMask& m, Options&) { m.kv_indices = {}; }, {"kv_indices is absent"}},
      {"full counts alone", [](BlockMask& m, Options&) { m.full_kv_indices = {}; }, {"full_kv_indices is absent"}},
      {"block size not a multiple of 16", [](BlockMask& m, Options&) { m.block_k = 24; },
       {"block_mask.block_k = 24", "multiples of 16"}},
      {"block size zero", [](BlockMask& m, Options&) { m.block_q = 0; }, {"block_mask.block_q = 0"}},
      {"counts in f32", [&](BlockMask& m, Options&) { m.kv_num_blocks = pr.num_f32.view(); },
       {"block_mask.kv_num_blocks has dtype f32, expected i32"}},
      {"too few query blocks", [&](BlockMask& m, Options&) { m.kv_num_blocks = pr.num_short.view(); },
       {"block_mask.kv_num_blocks has shape [2, 4, 2]", ">= 3"}},
      {"heads neither 1 nor heads_q", [&](BlockMask& m, Options&) { m.kv_num_blocks = pr.num_heads3.view(); },
       {"block_mask.kv_num_blocks has shape [2, 3, 3]", "1 or heads_q = 4"}},
      {"indices of rank 3", [&](BlockMask& m, Options&) { m.kv_indices = pr.idx_3d.view(); },
       {"block_mask.kv_indices must have 4 dimensions"}},
      {"indices rows unlike counts", [&](BlockMask& m, Options&) { m.kv_indices = pr.idx_rows.view(); },
       {"block_mask.kv_indices has shape [2, 4, 4, 2]", "must match block_mask.kv_num_blocks's [2, 4, 3]"}},
      {"full counts unlike counts", [&](BlockMask& m, Options&) { m.full_kv_num_blocks = pr.full_num_b1.view(); },
       {"block_mask.full_kv_num_blocks has shape [1, 4, 3], expected block_mask.kv_num_blocks's [2, 4, 3]"}},
      {"negative chunk", [](BlockMask&, Options& o) { o.chunk_size = -2; }, {"options.chunk_size = -2"}},
  });
}

// Document ids: both or neither, [batch, seqlen] int32 each.
TEST(ValidateBlockMask, DocumentIds) {
  Problem pr;
  pr.docs_q.fill(0);
  pr.docs_k.fill(0);
  struct DocCase {
    const char* what;
    const HostTensor *q, *k;
    std::vector<std::string> fragments;
  };
  for (const DocCase& c : std::vector<DocCase>{
           {"q alone", &pr.docs_q, nullptr, {"document_ids_q and document_ids_k must be given together", "document_ids_k is absent"}},
           {"k's shape for q", &pr.docs_k, &pr.docs_k, {"document_ids_q has shape [2, 70], expected [2, 40] (batch, seqlen)"}},
           {"f32 ids", &pr.docs_q, &pr.docs_f32, {"document_ids_k has dtype f32, expected i32"}},
       }) {
    SCOPED_TRACE(c.what);
    ForwardArgs f = pr.forward_args();
    f.document_ids_q = c.q ? c.q->view() : TensorView{};
    f.document_ids_k = c.k ? c.k->view() : TensorView{};
    auto fragments = c.fragments;
    fragments.push_back("tileattn::forward");
    test::expect_rejected([&] { forward(f); }, fragments, {&pr.out, &pr.lse});
    BackwardArgs b = pr.backward_args();
    b.document_ids_q = f.document_ids_q;
    b.document_ids_k = f.document_ids_k;
    fragments.back() = "tileattn::backward";
    test::expect_rejected([&] { backward(b); }, fragments, {&pr.dq, &pr.dk, &pr.dv});
  }
  ForwardArgs f = pr.forward_args();
  f.document_ids_q = pr.docs_q.view();
  f.document_ids_k = pr.docs_k.view();
  EXPECT_NO_THROW(forward(f));
}

TEST(ValidateBlockMask, CountsAndIndices) {
  Problem pr;
  auto with = [&](HostTensor& t, std::int64_t i, double v, const std::function<void()>& check) {
    const double old = t.get(i);
    t.set(i, v);
    check();
    t.set(i, old);
  };
  auto rejected = [&](std::vector<std::string> fragments) {
    return [&pr, fragments] {
      expect_all_rejected(pr, {{"mutated tensor", [](BlockMask&, Options&) {}, fragments}});
    };
  };
  // Row [1, 2, 1] is element 1 * 12 + 2 * 3 + 1 = 19 of the counts; its indices start at 38.
  with(pr.num, 19, 3, rejected({"block_mask.kv_num_blocks[1, 2, 1] = 3", "expected 0 <= count <= 2"}));
  with(pr.num, 19, -1, rejected({"block_mask.kv_num_blocks[1, 2, 1] = -1"}));
  with(pr.idx, 39, 3, rejected({"block_mask.kv_indices[1, 2, 1, 1] = 3 is outside [0, 3)"}));
  with(pr.idx, 39, -1, rejected({"block_mask.kv_indices[1, 2, 1, 1] = -1 is outside [0, 3)"}));
  with(pr.idx, 39, 0, rejected({"key block 0 appears twice in row [1, 2, 1]"}));
  with(pr.idx, 39, 2, rejected({"key block 2 appears twice in row [1, 2, 1]", "full_kv_indices"}));
  with(pr.full_idx, 4, 7, rejected({"block_mask.full_kv_indices[0, 1, 1, 0] = 7 is outside [0, 3)"}));
  // Entries past a row's count are never read, whatever they hold.
  with(pr.num, 19, 1, [&] {
    with(pr.idx, 39, -99, [&] { EXPECT_NO_THROW(forward(pr.forward_args())); });
  });
}

// The dense element mask: u8 [1 or batch, 1 or heads_q, seqlen_q, seqlen_k] on q's device, any
// strides within the address space, and only with a block mask.
TEST(ValidateBlockMask, DenseMask) {
  Problem pr;
  expect_all_rejected(pr, {
      {"f32 mask", [&](BlockMask& m, Options&) { m.mask = pr.mask_f32.view(); },
       {"block_mask.mask has dtype f32, expected u8"}},
      {"rank 3", [&](BlockMask& m, Options&) { m.mask = pr.mask_3d.view(); }, {"block_mask.mask must have 4 dimensions"}},
      {"a row too many", [&](BlockMask& m, Options&) { m.mask = pr.mask_rows.view(); },
       {"block_mask.mask has shape [2, 1, 41, 70], expected [1 or batch = 2, 1 or heads_q = 4, seqlen_q = 40, seqlen_k = 70]"}},
      {"3 heads of 4", [&](BlockMask& m, Options&) { m.mask = pr.mask_heads.view(); },
       {"block_mask.mask has shape [2, 3, 40, 70]", "1 or heads_q = 4"}},
      {"on another device", [&](BlockMask& m, Options&) {
         m.mask = pr.mask.view();
         m.mask.device = Device{DeviceType::cuda, 0};
       }, {"block_mask.mask is on cuda:0 but q is on cpu"}},
      {"stride past the address space", [&](BlockMask& m, Options&) {
         m.mask = pr.mask.view();
         m.mask.stride[2] = std::int64_t{1} << 56;
       }, {"block_mask.mask with shape [2, 1, 40, 70]", "reaches outside the 2^57-byte address space"}},
      {"element count overflows", [&](BlockMask& m, Options&) {
         m.mask = pr.mask.view();
         m.mask.shape[2] = m.mask.shape[3] = std::int64_t{1} << 40;
       }, {"block_mask.mask with shape", "more elements than fit in int64"}},
      {"null data", [&](BlockMask& m, Options&) {
         m.mask = pr.mask.view();
         m.mask.data = nullptr;
       }, {"block_mask.mask has 5600 elements but a null data pointer"}},
      {"without block lists", [&](BlockMask& m, Options&) {
         m = BlockMask{};
         m.mask = pr.mask.view();
       }, {"block_mask.mask is given without block_mask.kv_num_blocks and block_mask.kv_indices"}},
  });
  // Any strides: the mask transposed, broadcast over the batch and over rows (stride 0).
  ForwardArgs f = pr.forward_args();
  f.block_mask.mask = pr.mask.view();
  EXPECT_NO_THROW(forward(f));
  f.block_mask.mask = pr.mask_t.view();
  EXPECT_NO_THROW(forward(f));
  f.block_mask.mask = pr.mask.view();
  f.block_mask.mask.shape[0] = 1;
  f.block_mask.mask.stride[2] = 0;
  EXPECT_NO_THROW(forward(f));
}

// A written buffer over any of the block mask's tensors (they are inputs like any other) is
// rejected naming both; so is the caller's workspace over them. The mask's tensors are copied into
// one arena 16 KiB apart, so that a written buffer moved onto one reaches no other buffer.
TEST(ValidateBlockMask, OutputsMustNotOverlapTheMask) {
  Problem pr;
  constexpr std::int64_t kApart = 16384;
  HostTensor arena(DType::u8, {6 * kApart});
  const std::vector<std::pair<const char*, HostTensor*>> parts = {{"block_mask.kv_num_blocks", &pr.num},
                                                                  {"block_mask.kv_indices", &pr.idx},
                                                                  {"block_mask.full_kv_num_blocks", &pr.full_num},
                                                                  {"block_mask.full_kv_indices", &pr.full_idx},
                                                                  {"block_mask.mask", &pr.mask}};
  BlockMask m = pr.forward_args().block_mask;
  TensorView* views[] = {&m.kv_num_blocks, &m.kv_indices, &m.full_kv_num_blocks, &m.full_kv_indices, &m.mask};
  m.mask = pr.mask.view();
  for (std::size_t i = 0; i < parts.size(); ++i) {
    char* at = static_cast<char*>(arena.data()) + (i + 1) * kApart;
    std::memcpy(at, parts[i].second->data(), parts[i].second->numel() * dtype_size(parts[i].second->dtype()));
    views[i]->data = at;
  }
  const std::vector<HostTensor*> all = {&pr.out, &pr.lse, &pr.dq, &pr.dk, &pr.dv, &pr.q, &pr.k, &pr.v, &pr.dout, &arena};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const char* name = parts[i].first;
    SCOPED_TRACE(name);
    ForwardArgs f = pr.forward_args();
    f.block_mask = m;
    EXPECT_NO_THROW(forward(f));  // the arena's copy is a valid mask
    pr.poison();
    f.lse.data = views[i]->data;
    test::expect_rejected([&] { forward(f); }, {"tileattn::forward", "output lse overlaps input", name}, all);
    BackwardArgs b = pr.backward_args();
    b.block_mask = m;
    b.dk.data = views[i]->data;
    test::expect_rejected([&] { backward(b); }, {"tileattn::backward", "output dk overlaps input", name}, all);
    b = pr.backward_args();
    b.block_mask = m;
    b.options.workspace = static_cast<char*>(views[i]->data) + 1;
    b.options.workspace_bytes = 16;
    test::expect_rejected([&] { backward(b); }, {"tileattn::backward", "options.workspace", "overlaps", name}, all);
  }
}

// The CUDA backend takes no block mask yet: the core says so before any kernel sees it.
TEST(ValidateBlockMask, CudaBackendRejectsBlockMasks) {
  Problem pr;
  ForwardArgs f = pr.forward_args();
  f.options.backend = Backend::cuda;
  // Without a CUDA build the backend itself is rejected first; either way nothing is written.
  test::expect_rejected([&] { forward(f); }, {"tileattn::forward"}, {&pr.out, &pr.lse});
}

}  // namespace
}  // namespace tileattn
