// Entry points of the cuda backend that have no kernel yet.
#include "core/backends.hpp"
#include "tileattn/error.hpp"

namespace tileattn::cuda {

void backward(const Problem&, const BackwardArgs&) {
  throw Error("tileattn::backward: the cuda backend does not support backward yet");
}
std::size_t workspace_size(const Problem&, const BackwardArgs&) {
  throw Error("tileattn::workspace_size: the cuda backend does not support backward yet");
}

}  // namespace tileattn::cuda
