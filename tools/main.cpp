// The `tileattn` command: subcommands bench, peak and version.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "bench.hpp"
#include "fma_peak.hpp"
#include "core/backends.hpp"
#include "tileattn/error.hpp"

namespace {

const char* kUsage = R"(usage: tileattn <command> [flags]

commands:
  bench      time flash attention beside a standard attention, checked against the fp64
             reference (tileattn bench --help lists its flags)
  peak       measure this CPU's fp32 multiply-add rate on N threads, the ceiling of the fp32
             flash kernels (tileattn peak --help lists its flags)
  version    print the version and the backends this build has

tileattn --help prints this.
)";

int usage_error(const std::string& msg, const char* hint) {
  std::fprintf(stderr, "tileattn: %s\n%s", msg.c_str(), hint);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage_error("no command given", kUsage);
  const std::string& cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "version" || cmd == "--version") {
    std::printf("tileattn %s (backends: cpu_flash, cpu_reference%s)\n", TILEATTN_VERSION,
                tileattn::cuda_available() ? ", cuda" : "");
    return 0;
  }
  if (cmd != "bench" && cmd != "peak") return usage_error("unknown command '" + cmd + "'", kUsage);

  const std::vector<std::string> flags(args.begin() + 1, args.end());
  for (const auto& f : flags)
    if (f == "--help" || f == "-h") {
      std::fputs(cmd == "peak" ? tileattn::tools::peak_usage() : tileattn::tools::bench_usage(), stdout);
      return 0;
    }
  if (cmd == "peak") {
    try {
      return tileattn::tools::run_peak(flags);
    } catch (const tileattn::tools::UsageError& e) {
      return usage_error(e.what(), "run 'tileattn peak --help' for the flags\n");
    }
  }
  try {
    return tileattn::tools::run_bench(tileattn::tools::parse_bench_args(flags));
  } catch (const tileattn::tools::UsageError& e) {
    return usage_error(e.what(), "run 'tileattn bench --help' for the flags\n");
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tileattn bench: not enough memory for this problem's tensors (see --batch, --heads, --seqlen, "
                         "--hdim)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tileattn bench: %s\n", e.what());
    return 1;
  }
}
