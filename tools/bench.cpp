#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/backends.hpp"
#include "device.hpp"
#include "standard_attention.hpp"  // StandardShape, and the baseline where OpenBLAS was found
#include "support/host_tensor.hpp"
#include "tileattn/tileattn.hpp"

namespace tileattn::tools {
namespace {

using test::HostTensor;

// Above this many multiply-adds per call the oracle checks only the last query rows of batch 0
// (their output, LSE and dQ need only those rows); below it, everything.
constexpr double kFullCheckMacs = 1 << 27;
constexpr std::int64_t kCheckRows = 32;

#if defined(TILEATTN_CLI_BLAS)
constexpr bool kHaveStandard = true;
#else
constexpr bool kHaveStandard = false;  // built without OpenBLAS: the baseline's memory only
#endif

struct Shape {
  int batch, heads, heads_kv, seqlen_q, seqlen_k, hdim;
  bool causal, bhsd;
  DType dtype;
  Backend backend;

  double fwd_flops() const {
    const double f = 4.0 * batch * heads * seqlen_q * double(seqlen_k) * hdim;
    return causal ? f / 2 : f;
  }
  double bwd_flops() const { return 2.5 * fwd_flops(); }
  bool on_cuda() const { return backend == Backend::cuda; }
};

// One pass (fwd or bwd) of one implementation at one length.
struct Timing {
  double ms = NAN;
  std::size_t extra_bytes = 0;
  std::string note;  // why it was not timed, when it was not
};

struct Row {
  int seqlen = 0;
  Timing flash_fwd, flash_bwd, std_fwd, std_bwd;
  double err_fwd = NAN, err_bwd = NAN;  // max relative L2 error over the checked outputs
  double err_std_fwd = NAN, err_std_bwd = NAN;
  std::string checked;                  // "all", "last N rows", or empty when not checked
};

// A tensor on the host and, for the cuda backend, its device copy.
struct Operand {
  HostTensor host;
  std::unique_ptr<DeviceBuffer> dev;

  Operand(DType dt, std::vector<std::int64_t> shape, bool cuda, std::vector<int> order = {})
      : host(dt, std::move(shape), std::move(order)) {
    if (cuda) dev = std::make_unique<DeviceBuffer>(host.numel() * dtype_size(dt));
  }
  TensorView view() {
    TensorView v = host.view();
    if (dev) {
      v.data = dev->data();
      v.device = Device{DeviceType::cuda, 0};
    }
    return v;
  }
  void upload() {
    if (dev) dev->upload(host.data());
  }
  void download() {
    if (dev) dev->download(host.data());
  }
};

std::vector<float> as_f32(const HostTensor& t) {
  std::vector<float> out(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<float>(t.get(i));
  return out;
}

TensorView f32_view(std::vector<float>& v, std::initializer_list<std::int64_t> shape) {
  return view(v.data(), DType::f32, shape);
}

template <class F>
double median_ms(int repeat, bool cuda, F&& call) {
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    if (cuda) cuda_synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
}

// The warm-up call, with the library's host memory counted: the peak it holds during the call,
// including anything it keeps between calls (per-thread tiles), since nothing else in this
// process allocates through it.
template <class F>
std::size_t measured_scratch(bool cuda, F&& call) {
  reset_peak_memory();
  call();
  if (cuda) cuda_synchronize();
  return memory_stats().peak_bytes;
}

// A caller-owned workspace of the size the workspace query asks for, host or device.
struct Workspace {
  std::vector<unsigned char> host;
  std::unique_ptr<DeviceBuffer> dev;
  std::size_t bytes = 0;

  Workspace(std::size_t n, bool cuda) : bytes(n) {
    if (n == 0) return;
    if (cuda) dev = std::make_unique<DeviceBuffer>(n);
    else host.resize(n);
  }
  void attach(Options& o) {
    o.workspace = bytes == 0 ? nullptr : dev ? dev->data() : static_cast<void*>(host.data());
    o.workspace_bytes = bytes;
  }
};

double tolerance(DType dt) {
  switch (dt) {
    case DType::f16: return 1e-2;
    case DType::bf16: return 4e-2;
    default: return 1e-4;
  }
}

std::size_t standard_limit_bytes() {
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  return static_cast<std::size_t>(std::min(phys / 4, 16.0 * (1ull << 30)));
}

// The checked part of each implementation's results, as doubles: output and LSE rows, gradients.
struct Outputs {
  std::vector<double> out, lse, dq, dk, dv;
};

class Runner {
 public:
  Runner(const Shape& s, const BenchConfig& c) : s_(s), c_(c) {
    full_ = s_.fwd_flops() / 4 <= kFullCheckMacs;
    nb_ = full_ ? s_.batch : 1;
    rows_ = full_ ? s_.seqlen_q : std::min<std::int64_t>(s_.seqlen_q, kCheckRows);
    first_ = s_.seqlen_q - rows_;  // the last rows keep their bottom-right mask alignment
  }

  Row run() {
    Row row;
    row.seqlen = s_.seqlen_q;
    const bool cuda = s_.on_cuda();
    const std::int64_t B = s_.batch, Sq = s_.seqlen_q, Sk = s_.seqlen_k, H = s_.heads,
                       Hk = s_.heads_kv, D = s_.hdim;
    const std::vector<int> order = s_.bhsd ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{};
    Operand q(s_.dtype, {B, Sq, H, D}, cuda, order), k(s_.dtype, {B, Sk, Hk, D}, cuda, order),
        v(s_.dtype, {B, Sk, Hk, D}, cuda, order), out(s_.dtype, {B, Sq, H, D}, cuda, order),
        lse(DType::f32, {B, H, Sq}, cuda), dout(s_.dtype, {B, Sq, H, D}, false, order);
    std::mt19937_64 rng(Sq * 1000003 + Sk);
    for (Operand* t : {&q, &k, &v, &dout}) t->host.fill_normal(rng);
    for (Operand* t : {&q, &k, &v}) t->upload();
    const int repeat = c_.repeat ? c_.repeat : s_.fwd_flops() > 2e10 ? 3 : 5;
    const auto get = [](const HostTensor& t) { return [&t](std::int64_t i) { return t.get(i); }; };

    ForwardArgs fa;
    fa.q = q.view(), fa.k = k.view(), fa.v = v.view(), fa.out = out.view(), fa.lse = lse.view();
    fa.options.causal = s_.causal;
    fa.options.backend = s_.backend;
    Workspace fws(workspace_size(fa), cuda);
    fws.attach(fa.options);
    row.flash_fwd.extra_bytes = fws.bytes + measured_scratch(cuda, [&] { forward(fa); });
    row.flash_fwd.ms = median_ms(repeat, cuda, [&] { forward(fa); });
    out.download();
    lse.download();
    Outputs flash{pick_rows(get(out.host), H * D), pick_lse(get(lse.host)), {}, {}, {}};

    if (c_.bwd) {
      Operand dq(s_.dtype, {B, Sq, H, D}, cuda, order), dk(s_.dtype, {B, Sk, Hk, D}, cuda, order),
          dv(s_.dtype, {B, Sk, Hk, D}, cuda, order), dout_dev(s_.dtype, {B, Sq, H, D}, cuda, order);
      dout_dev.host = dout.host;
      dout_dev.upload();
      BackwardArgs ba;
      ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.out = fa.out, ba.lse = fa.lse;
      ba.dout = dout_dev.view(), ba.dq = dq.view(), ba.dk = dk.view(), ba.dv = dv.view();
      ba.options.causal = s_.causal;
      ba.options.backend = s_.backend;
      Workspace bws(workspace_size(ba), cuda);
      bws.attach(ba.options);
      row.flash_bwd.extra_bytes = bws.bytes + measured_scratch(cuda, [&] { backward(ba); });
      row.flash_bwd.ms = median_ms(repeat, cuda, [&] { backward(ba); });
      for (Operand* t : {&dq, &dk, &dv}) t->download();
      flash.dq = pick_rows(get(dq.host), H * D);
      if (full_) flash.dk = dk.host.to_f64(), flash.dv = dv.host.to_f64();
    }

    std::optional<Outputs> oracle;
    if (c_.check) {
      oracle = reference(q.host, k.host, v.host, dout.host);
      row.err_fwd = std::max(test::rel_error(flash.out, oracle->out), test::rel_error(flash.lse, oracle->lse));
      if (c_.bwd) row.err_bwd = grad_error(flash, *oracle);
      row.checked = full_ ? "all" : "last " + std::to_string(rows_) + " rows";
    }
    if (c_.standard) standard(row, q.host, k.host, v.host, dout.host, repeat, oracle);
    return row;
  }

 private:
  // The checked rows [first_, first_ + rows_) of the first nb_ batches of a [batch, seqlen_q, ...]
  // tensor with `width` elements per row.
  template <class Get>
  std::vector<double> pick_rows(Get get, std::int64_t width) const {
    std::vector<double> v;
    v.reserve(nb_ * rows_ * width);
    for (std::int64_t b = 0; b < nb_; ++b)
      for (std::int64_t i = 0; i < rows_ * width; ++i) v.push_back(get((b * s_.seqlen_q + first_) * width + i));
    return v;
  }
  template <class Get>
  std::vector<double> pick_lse(Get get) const {  // from [batch, heads, seqlen_q]
    std::vector<double> v;
    for (std::int64_t bh = 0; bh < nb_ * s_.heads; ++bh)
      for (std::int64_t i = 0; i < rows_; ++i) v.push_back(get(bh * s_.seqlen_q + first_ + i));
    return v;
  }

  double grad_error(const Outputs& got, const Outputs& ref) const {
    double e = test::rel_error(got.dq, ref.dq);
    if (full_)  // dK and dV sum over every query row: compared only when all rows are
      e = std::max({e, test::rel_error(got.dk, ref.dk), test::rel_error(got.dv, ref.dv)});
    return e;
  }

  // The oracle on fp32 copies of the inputs (the same values), over the checked rows only.
  Outputs reference(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                    const HostTensor& dout) const {
    const std::int64_t Sq = s_.seqlen_q, Sk = s_.seqlen_k, H = s_.heads, Hk = s_.heads_kv,
                       D = s_.hdim, nb = nb_, R = rows_;
    std::vector<float> q32 = as_f32(q), k32 = as_f32(k), v32 = as_f32(v), do32 = as_f32(dout);
    std::vector<float> o(nb * R * H * D), lse(nb * H * R);
    ForwardArgs fa;
    fa.q = view(q32.data() + first_ * H * D, DType::f32, {nb, R, H, D}, {Sq * H * D, H * D, D, 1});
    fa.k = f32_view(k32, {nb, Sk, Hk, D});
    fa.v = f32_view(v32, {nb, Sk, Hk, D});
    fa.out = f32_view(o, {nb, R, H, D});
    fa.lse = f32_view(lse, {nb, H, R});
    fa.options.causal = s_.causal;
    fa.options.backend = Backend::cpu_reference;
    forward(fa);
    Outputs ref{{o.begin(), o.end()}, {lse.begin(), lse.end()}, {}, {}, {}};
    if (!c_.bwd) return ref;

    std::vector<float> dq(nb * R * H * D), dk(nb * Sk * Hk * D), dv(nb * Sk * Hk * D);
    BackwardArgs ba;
    ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.out = fa.out, ba.lse = fa.lse;
    ba.dout = view(do32.data() + first_ * H * D, DType::f32, {nb, R, H, D}, {Sq * H * D, H * D, D, 1});
    ba.dq = f32_view(dq, {nb, R, H, D});
    ba.dk = f32_view(dk, {nb, Sk, Hk, D});
    ba.dv = f32_view(dv, {nb, Sk, Hk, D});
    ba.options = fa.options;
    backward(ba);
    ref.dq.assign(dq.begin(), dq.end());
    ref.dk.assign(dk.begin(), dk.end());
    ref.dv.assign(dv.begin(), dv.end());
    return ref;
  }

  // Parameters go unused where the tool was built without OpenBLAS.
  void standard(Row& row, [[maybe_unused]] const HostTensor& q, [[maybe_unused]] const HostTensor& k,
                [[maybe_unused]] const HostTensor& v, [[maybe_unused]] const HostTensor& dout,
                [[maybe_unused]] int repeat, [[maybe_unused]] const std::optional<Outputs>& oracle) {
    StandardShape ss{s_.batch, s_.heads, s_.heads_kv, s_.seqlen_q, s_.seqlen_k, s_.hdim, s_.causal,
                     1.f / std::sqrt(float(s_.hdim))};
    const std::size_t need = standard_extra_bytes(ss);
    row.std_fwd.extra_bytes = row.std_bwd.extra_bytes = need;
    if (s_.on_cuda()) {
      row.std_fwd.note = row.std_bwd.note = "cpu only";
      return;
    }
    if (need > standard_limit_bytes()) {
      row.std_fwd.note = row.std_bwd.note = "too big";
      return;
    }
#if !defined(TILEATTN_CLI_BLAS)
    row.std_fwd.note = row.std_bwd.note = "no BLAS";
#else
    StandardAttention sa(ss, num_threads());
    std::vector<float> q32 = as_f32(q), k32 = as_f32(k), v32 = as_f32(v), o(q32.size());
    auto fwd = [&] { sa.forward(q32.data(), k32.data(), v32.data(), o.data()); };
    fwd();
    row.std_fwd.ms = median_ms(repeat, false, fwd);
    const auto at = [](const std::vector<float>& x) { return [&x](std::int64_t i) { return double(x[i]); }; };
    if (oracle) row.err_std_fwd = test::rel_error(pick_rows(at(o), s_.heads * s_.hdim), oracle->out);
    if (!c_.bwd) return;
    std::vector<float> do32 = as_f32(dout), dq(o.size()), dk(k32.size()), dv(v32.size());
    auto bwd = [&] { sa.backward(q32.data(), k32.data(), v32.data(), o.data(), do32.data(), dq.data(), dk.data(), dv.data()); };
    bwd();
    row.std_bwd.ms = median_ms(repeat, false, bwd);
    if (oracle) {
      Outputs got{{}, {}, pick_rows(at(dq), s_.heads * s_.hdim), {}, {}};
      if (full_) got.dk.assign(dk.begin(), dk.end()), got.dv.assign(dv.begin(), dv.end());
      row.err_std_bwd = grad_error(got, *oracle);
    }
#endif
  }

  Shape s_;
  const BenchConfig& c_;
  bool full_;
  std::int64_t nb_, rows_, first_;
};

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::cpu_flash: return "cpu_flash";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cuda: return "cuda";
    default: return "auto";
  }
}

const char* json_dtype(DType t) { return t == DType::f32 ? "fp32" : t == DType::f16 ? "fp16" : "bf16"; }

std::string bytes_str(std::size_t b) {
  char buf[32];
  const double x = double(b);
  if (x >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", x / (1024.0 * 1024 * 1024));
  else if (x >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", x / (1024.0 * 1024));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", x / 1024.0);
  return buf;
}

std::string time_str(const Timing& t) {
  if (!t.note.empty()) return t.note;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", t.ms);
  return buf;
}

std::string gflops_str(const Timing& t, double flops) {
  if (!t.note.empty()) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", flops / t.ms / 1e6);
  return buf;
}

std::string err_str(double e, double tol) {
  if (std::isnan(e)) return "not checked";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1e %s", e, e <= tol ? "ok" : "FAIL");
  return buf;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

void print_table(const Shape& s, const BenchConfig& c, const std::vector<Row>& rows,
                 const std::string& device) {
  std::printf("tileattn bench: %s on %s, %s, batch %d, heads %d (kv %d), hdim %d, %s, %s, %d threads\n",
              backend_name(s.backend), device.c_str(), dtype_name(s.dtype), s.batch, s.heads,
              s.heads_kv, s.hdim, s.causal ? "causal" : "non-causal", s.bhsd ? "bhsd" : "bshd", num_threads());
  std::printf("flash: tileattn; standard: BLAS GEMMs with S and P materialized (fp32)%s\n\n",
              s.on_cuda() ? ", CPU only: memory shown" : !kHaveStandard ? ", not built: memory shown" : "");
  std::printf("%7s %4s | %9s %8s %10s | %9s %8s %10s | %7s | %s\n", "seqlen", "pass", "flash ms",
              "GFLOP/s", "extra mem", "std ms", "GFLOP/s", "S+P mem", "speedup", "error vs fp64");
  const double tol = tolerance(s.dtype);
  for (const Row& r : rows) {
    Shape rs = s;
    rs.seqlen_q = r.seqlen;
    rs.seqlen_k = c.seqlen_k ? c.seqlen_k : r.seqlen;
    for (int pass = 0; pass < (c.bwd ? 2 : 1); ++pass) {
      const Timing& f = pass ? r.flash_bwd : r.flash_fwd;
      const Timing& st = pass ? r.std_bwd : r.std_fwd;
      const double flops = pass ? rs.bwd_flops() : rs.fwd_flops();
      std::string speedup = "-";
      if (c.standard && st.note.empty()) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "%.2fx", st.ms / f.ms);
        speedup = buf;
      }
      std::string err = err_str(pass ? r.err_bwd : r.err_fwd, tol);
      if (const double e = pass ? r.err_std_bwd : r.err_std_fwd; e > tolerance(DType::f32)) err += ", standard FAIL";
      if (!r.checked.empty() && r.checked != "all") err += " (" + r.checked + ")";
      std::printf("%7d %4s | %9s %8s %10s | %9s %8s %10s | %7s | %s\n", r.seqlen, pass ? "bwd" : "fwd",
                  time_str(f).c_str(), gflops_str(f, flops).c_str(), bytes_str(f.extra_bytes).c_str(),
                  c.standard ? time_str(st).c_str() : "-", c.standard ? gflops_str(st, flops).c_str() : "-",
                  c.standard ? bytes_str(st.extra_bytes).c_str() : "-", speedup.c_str(), err.c_str());
    }
  }
  std::printf("\nextra mem: memory beyond inputs and outputs (flash: workspace + library scratch; "
              "standard: its S and P buffers)\n");
}

void print_json(const Shape& s, const BenchConfig& c, const std::vector<Row>& rows,
                const std::string& device) {
  std::printf("{\"device\": \"%s\", \"date\": \"%s\", \"commit\": null, \"ceilings\": null, \"rows\": [",
              device.c_str(), today().c_str());
  bool first = true;
  const std::string prefix = s.on_cuda() ? "" : "cpu-";
  for (const Row& r : rows) {
    Shape rs = s;
    rs.seqlen_q = r.seqlen;
    rs.seqlen_k = c.seqlen_k ? c.seqlen_k : r.seqlen;
    for (int pass = 0; pass < (c.bwd ? 2 : 1); ++pass) {
      const double flops = pass ? rs.bwd_flops() : rs.fwd_flops();
      for (int impl = 0; impl < (c.standard ? 2 : 1); ++impl) {
        const Timing& t = impl ? (pass ? r.std_bwd : r.std_fwd) : (pass ? r.flash_bwd : r.flash_fwd);
        if (!t.note.empty()) continue;
        std::printf("%s\n  {\"grid\": \"%s%s\", \"impl\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, "
                    "\"seqlen_q\": %d, \"seqlen_k\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"hdim\": %d, "
                    "\"causal\": %s, \"page_size\": null, \"ms\": %.6g, \"tflops\": %.6g, \"tbps\": null, "
                    "\"backend\": \"%s\", \"threads\": %d, \"layout\": \"%s\", \"extra_bytes\": %zu",
                    first ? "" : ",", prefix.c_str(), pass ? "bwd" : "fwd", impl ? "standard-blas" : "tileattn",
                    json_dtype(s.dtype), s.batch, rs.seqlen_q, rs.seqlen_k, s.heads, s.heads_kv, s.hdim,
                    s.causal ? "true" : "false", t.ms, flops / t.ms / 1e9,
                    impl ? "cpu_blas" : backend_name(s.backend), num_threads(), s.bhsd ? "bhsd" : "bshd",
                    t.extra_bytes);
        const double err = impl ? (pass ? r.err_std_bwd : r.err_std_fwd) : (pass ? r.err_bwd : r.err_fwd);
        if (!std::isnan(err)) std::printf(", \"max_rel_err\": %.3g", err);
        std::printf("}");
        first = false;
      }
    }
  }
  std::printf("\n]}\n");
}

}  // namespace

int run_bench(const BenchConfig& c) {
  set_num_threads(c.threads);
  Shape s{};
  s.backend = c.backend;
  const bool has_cuda = cuda_available() && cuda_device_present();
  if (s.backend == Backend::automatic) s.backend = has_cuda ? Backend::cuda : Backend::cpu_flash;
  if (s.backend == Backend::cuda && !has_cuda) {
    std::fprintf(stderr, "tileattn bench: --backend cuda, but this build has no CUDA backend or no device answers\n");
    return 1;
  }
  s.batch = c.batch, s.heads = c.heads, s.heads_kv = c.heads_kv ? c.heads_kv : c.heads;
  s.hdim = c.hdim, s.causal = c.causal, s.bhsd = c.bhsd;
  s.dtype = c.dtype ? *c.dtype : s.on_cuda() ? DType::bf16 : DType::f32;
  std::vector<int> lens = c.seqlens;
  if (lens.empty()) lens = s.on_cuda() ? std::vector<int>{1024, 4096, 16384} : std::vector<int>{512, 1024, 2048, 4096};
  const std::string device = s.on_cuda() ? cuda_device_name() : cpu_name();

  std::vector<Row> rows;
  bool ok = true;
  for (int len : lens) {
    Shape rs = s;
    rs.seqlen_q = len;
    rs.seqlen_k = c.seqlen_k ? c.seqlen_k : len;
    rows.push_back(Runner(rs, c).run());
    const double tol = tolerance(s.dtype);
    const Row& r = rows.back();
    for (double e : {r.err_fwd, r.err_bwd}) ok = ok && (std::isnan(e) || e <= tol);
    // The standard path computes in fp32 from the same input values.
    for (double e : {r.err_std_fwd, r.err_std_bwd}) ok = ok && (std::isnan(e) || e <= tolerance(DType::f32));
  }
  if (c.json) print_json(s, c, rows, device);
  else print_table(s, c, rows, device);
  if (!ok) std::fprintf(stderr, "tileattn bench: a result differs from the fp64 reference beyond its tolerance\n");
  return ok ? 0 : 1;
}

}  // namespace tileattn::tools
