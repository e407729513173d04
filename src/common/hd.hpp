// Lets one header serve host C++ and CUDA device code.
#pragma once

#if defined(__CUDACC__)
#define TA_HD __host__ __device__ __forceinline__
#else
#define TA_HD inline
#endif
