// GPT_HOST_DEVICE marks the small functions compiled for host and device alike (counter-based RNG, bf16
// rounding), so CUDA kernels compute exactly what the CPU code does.
#pragma once

#if defined(__CUDACC__)
#define GPT_HOST_DEVICE __host__ __device__
#else
#define GPT_HOST_DEVICE
#endif
