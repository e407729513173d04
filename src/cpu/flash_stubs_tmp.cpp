#include "core/backends.hpp"
#include "tileattn/error.hpp"
namespace tileattn::cpu {
void flash_decode(const Problem&, const DecodeArgs&) { throw Error("todo"); }
std::size_t workspace_size(const Problem&, const DecodeArgs&) { return 0; }
}
