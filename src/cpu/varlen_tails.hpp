// Varlen: the rows of a packed tensor past cu_seqlens[batch] belong to no sequence. The CPU backends
// write them as an empty sequence's: out = 0 and lse = -inf (rows that see no key), dq = 0 and
// dk = dv = 0 (rows and keys that take part in nothing), so that a caller who packs its sequences into
// a buffer of fixed size and reads or differentiates all of it never meets uninitialized memory.
#pragma once

#include "core/problem.hpp"

namespace tileattn::cpu {

void write_varlen_tails(const Problem& p, const ForwardArgs& a);
void write_varlen_tails(const Problem& p, const BackwardArgs& a);

}  // namespace tileattn::cpu
