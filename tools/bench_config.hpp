// `tileattn bench` flags: what to run, parsed and checked before anything runs.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tileattn/options.hpp"
#include "tileattn/tensor.hpp"

namespace tileattn::tools {

// A bad command line: main prints it with a pointer to --help and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` as an integer flag value in [lo, hi]; a UsageError naming the flag otherwise.
int parse_int(const std::string& flag, const std::string& text, int lo, int hi);

struct BenchConfig {
  int batch = 1;
  int heads = 8;
  int heads_kv = 0;             // 0: same as heads
  int hdim = 64;
  std::vector<int> seqlens;     // empty: the backend's default list
  int seqlen_k = 0;             // 0: same as each seqlen
  std::optional<DType> dtype;   // default: f32 on the CPU, bf16 on CUDA
  bool causal = false;
  bool bhsd = false;            // q, k, v, out and their gradients stored [batch, heads, seqlen, d]
  Backend backend = Backend::automatic;
  int threads = 0;              // 0: all hardware threads
  int repeat = 0;               // 0: chosen from the problem size
  bool bwd = false;
  bool json = false;
  bool standard = true;         // time the standard attention beside the flash path
  bool check = true;            // compare with the fp64 reference
};

BenchConfig parse_bench_args(const std::vector<std::string>& args);
const char* bench_usage();

}  // namespace tileattn::tools
