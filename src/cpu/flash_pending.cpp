// Placeholder entry points until the CPU flash backend lands: they fail loudly, never silently.
#include "core/backends.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cpu {

void flash_forward(const Problem&, const ForwardArgs&) { throw Error("tileattn::forward: the cpu_flash backend is not built yet; use Backend::cpu_reference"); }
void flash_backward(const Problem&, const BackwardArgs&) { throw Error("tileattn::backward: the cpu_flash backend is not built yet; use Backend::cpu_reference"); }
void flash_decode(const Problem&, const DecodeArgs&) { throw Error("tileattn::decode: the cpu_flash backend is not built yet; use Backend::cpu_reference"); }
std::size_t workspace_size(const Problem&, const ForwardArgs&) { return 0; }
std::size_t workspace_size(const Problem&, const BackwardArgs&) { return 0; }
std::size_t workspace_size(const Problem&, const DecodeArgs&) { return 0; }

}  // namespace tileattn::cpu
