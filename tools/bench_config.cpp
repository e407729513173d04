#include "bench_config.hpp"

#include <charconv>
#include <cstdint>

namespace tileattn::tools {

int parse_int(const std::string& flag, const std::string& text, int lo, int hi) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || p != end)
    throw UsageError(flag + " expects an integer, got '" + text + "'");
  if (v < lo || v > hi)
    throw UsageError(flag + " = " + text + " is outside [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  return v;
}

namespace {

std::vector<int> parse_int_list(const std::string& flag, const std::string& text, int lo, int hi) {
  std::vector<int> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t comma = text.find(',', pos);
    out.push_back(parse_int(flag, text.substr(pos, comma - pos), lo, hi));
    if (comma == std::string::npos) return out;
    pos = comma + 1;
  }
}

DType parse_dtype(const std::string& text) {
  if (text == "f32" || text == "fp32") return DType::f32;
  if (text == "f16" || text == "fp16") return DType::f16;
  if (text == "bf16") return DType::bf16;
  throw UsageError("--dtype expects f32, f16 or bf16, got '" + text + "'");
}

Backend parse_backend(const std::string& text) {
  if (text == "auto") return Backend::automatic;
  if (text == "cpu_flash" || text == "cpu") return Backend::cpu_flash;
  if (text == "cpu_reference" || text == "reference") return Backend::cpu_reference;
  if (text == "cuda") return Backend::cuda;
  throw UsageError("--backend expects auto, cpu_flash, cpu_reference or cuda, got '" + text + "'");
}

bool parse_layout(const std::string& text) {
  if (text == "bshd" || text == "bhsd") return text == "bhsd";
  throw UsageError("--layout expects bshd or bhsd, got '" + text + "'");
}

}  // namespace

const char* bench_usage() {
  return R"(usage: tileattn bench [flags]

Times the flash attention path beside a standard attention that materializes S and P,
checks results against the fp64 reference, and prints time, GFLOP/s and extra memory.

  --batch N          batch size (default 1)
  --heads N          query heads (default 8)
  --heads-kv N       key/value heads, dividing --heads (default: --heads)
  --seqlen N         one query length; --seqlens N,N,... for several (default: a few)
  --seqlen-k N       key length (default: the query length)
  --hdim N           head dim, a multiple of 8 up to 256 (default 64)
  --dtype T          f32, f16 or bf16 (default: f32 on the CPU, bf16 on CUDA)
  --causal           causal mask (bottom-right aligned)
  --layout L         bshd or bhsd: how q, k, v, out and the gradients lie in memory, as
                     [batch, seqlen, heads, d] or [batch, heads, seqlen, d] (default bshd)
  --backend B        auto, cpu_flash, cpu_reference or cuda (default auto: cuda when built
                     and a device is present, else cpu_flash)
  --threads N        CPU threads for both paths (default: all)
  --repeat N         timed runs after one warm-up; the median is reported (default: by size)
  --bwd              time the backward pass too
  --no-standard      skip the standard attention
  --no-check         skip the comparison with the fp64 reference
  --json             print a JSON record instead of the table
)";
}

BenchConfig parse_bench_args(const std::vector<std::string>& args) {
  constexpr int kBig = 1 << 24;
  BenchConfig c;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    bool has_value = false;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    auto next = [&]() -> const std::string& {
      if (!has_value) {
        if (i + 1 >= args.size()) throw UsageError(flag + " expects a value");
        value = args[++i];
        has_value = true;
      }
      return value;
    };
    auto no_value = [&] {
      if (has_value) throw UsageError(flag + " takes no value");
    };
    if (flag == "--batch") c.batch = parse_int(flag, next(), 1, kBig);
    else if (flag == "--heads") c.heads = parse_int(flag, next(), 1, 4096);
    else if (flag == "--heads-kv") c.heads_kv = parse_int(flag, next(), 1, 4096);
    else if (flag == "--seqlen" || flag == "--seqlens") c.seqlens = parse_int_list(flag, next(), 1, kBig);
    else if (flag == "--seqlen-k") c.seqlen_k = parse_int(flag, next(), 1, kBig);
    else if (flag == "--hdim") c.hdim = parse_int(flag, next(), 8, 256);
    else if (flag == "--dtype") c.dtype = parse_dtype(next());
    else if (flag == "--causal") { no_value(); c.causal = true; }
    else if (flag == "--layout") c.bhsd = parse_layout(next());
    else if (flag == "--backend") c.backend = parse_backend(next());
    else if (flag == "--threads") c.threads = parse_int(flag, next(), 0, 4096);
    else if (flag == "--repeat") c.repeat = parse_int(flag, next(), 1, 100000);
    else if (flag == "--bwd") { no_value(); c.bwd = true; }
    else if (flag == "--no-standard") { no_value(); c.standard = false; }
    else if (flag == "--no-check") { no_value(); c.check = false; }
    else if (flag == "--json") { no_value(); c.json = true; }
    else throw UsageError("unknown flag '" + args[i] + "'");
  }
  if (c.hdim % 8 != 0) throw UsageError("--hdim = " + std::to_string(c.hdim) + " must be a multiple of 8");
  if (c.heads_kv != 0 && c.heads % c.heads_kv != 0)
    throw UsageError("--heads-kv = " + std::to_string(c.heads_kv) + " must divide --heads = " +
                     std::to_string(c.heads));
  return c;
}

}  // namespace tileattn::tools
