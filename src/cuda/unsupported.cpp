// Entry points of the cuda backend that have no kernel yet.
#include "core/backends.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {

void backward(const Problem&, const BackwardArgs&) {
  throw Error("tileattn::backward: the cuda backend does not support backward yet");
}
void decode(const Problem&, const DecodeArgs&) {
  throw Error("tileattn::decode: the cuda backend does not support decode yet");
}
void combine(const Problem&, const CombineArgs&) {
  throw Error("tileattn::combine: the cuda backend does not support combine yet");
}
std::size_t workspace_size(const Problem&, const BackwardArgs&) {
  throw Error("tileattn::workspace_size: the cuda backend does not support backward yet");
}
std::size_t workspace_size(const Problem&, const DecodeArgs&) {
  throw Error("tileattn::workspace_size: the cuda backend does not support decode yet");
}

}  // namespace tileattn::cuda
