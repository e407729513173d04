// `tileattn bench`: the flash path timed beside a standard attention, checked against the oracle.
#pragma once

#include "bench_config.hpp"

namespace tileattn::tools {

// Returns the process exit status: 0, or 1 when a result fails its check or the library throws.
int run_bench(const BenchConfig& config);

}  // namespace tileattn::tools
