// The fp64 reference: the oracle of every test.
#pragma once

#include "core/problem.hpp"

namespace tileattn::cpu {

enum class RefPrecision {
  f64,          // exact up to fp64 rounding: the oracle
  input_dtype,  // standard attention in the input dtype: S, P, dS and outputs rounded to it; the
                // baseline of the DESIGN.md tolerance rule
};

void reference_forward(const Problem& p, const ForwardArgs& a, RefPrecision prec);
void reference_backward(const Problem& p, const BackwardArgs& a, RefPrecision prec);
void reference_decode(const Problem& p, const DecodeArgs& a, RefPrecision prec);

}  // namespace tileattn::cpu
