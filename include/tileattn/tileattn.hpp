// tileattn: exact, IO-aware attention (FlashAttention) for CPUs and NVIDIA GPUs.
#pragma once

#include "tileattn/attention.hpp"
#include "tileattn/error.hpp"
#include "tileattn/options.hpp"
#include "tileattn/tensor.hpp"
#include "tileattn/version.hpp"
