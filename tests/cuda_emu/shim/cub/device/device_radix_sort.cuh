// Emulation stand-in for cub::DeviceRadixSort::SortPairs: a stable sort of (key, value) pairs by key on
// bits [begin_bit, end_bit) (cub's order for signed int32: as signed integers when all 32 bits are used).
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>
#include "cuda_runtime.h"
namespace cub {
inline size_t emu_sort_temp_bytes = 1536;  // what the emulated cub asks for (any size works)
struct DeviceRadixSort {
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const int32_t* keys_in, int32_t* keys_out,
                               const int32_t* values_in, int32_t* values_out, int n, int begin_bit, int end_bit,
                               cudaStream_t stream = nullptr) {
    if (temp == nullptr) { temp_bytes = emu_sort_temp_bytes; return 0; }
    if (temp_bytes < emu_sort_temp_bytes || begin_bit != 0 || end_bit != 32) std::abort();
    emu_enqueue(stream, [=] {  // when the stream gets to it
      std::memset(temp, 0xAB, temp_bytes);  // touches all of temp: ASan flags a too-small scratch
      std::vector<std::pair<int32_t, int32_t>> v(n);
      for (int i = 0; i < n; ++i) v[i] = {keys_in[i], values_in[i]};
      std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first < b.first; });
      for (int i = 0; i < n; ++i) { keys_out[i] = v[i].first; values_out[i] = v[i].second; }
    });
    return 0;
  }
};
}  // namespace cub
