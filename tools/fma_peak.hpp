// `tileattn peak`: the CPU's fp32 multiply-add rate on N threads, the ceiling of the CPU flash
// kernels' fp32 products. Measured rather than computed from a clock and a core count, which a
// virtual machine or a shared host does not state truthfully.
#pragma once

#include <string>
#include <vector>

namespace tileattn::tools {

// Usage text for `tileattn peak --help`.
const char* peak_usage();

// Parses the flags after `peak`, measures, prints; returns the process exit status. Throws
// UsageError on a bad flag.
int run_peak(const std::vector<std::string>& flags);

}  // namespace tileattn::tools
