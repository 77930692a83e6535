// The tracked allocator: every byte the engine allocates for model state or activations belongs to a
// category, and the allocator keeps current and peak bytes per category (and in total) so the trainer
// can report measured memory beside the planner's figures. Buffers are 64-byte aligned host memory on
// the CPU backend; a device backend hands out Buffers that own device memory (Buffer::adopt) and are
// counted by the same categories. Thread-safe (atomic counters). A Buffer owns its bytes and returns them
// when destroyed.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpt {

enum class MemCategory : uint8_t { kParams, kMaster, kGrads, kOptimizer, kActivations, kComm, kWorkspace, kCount };
constexpr size_t kNumMemCategories = static_cast<size_t>(MemCategory::kCount);

constexpr std::string_view mem_category_name(MemCategory c) {
  constexpr std::array<std::string_view, kNumMemCategories> kNames = {"params",      "master", "grads",    "optimizer",
                                                                      "activations", "comm",   "workspace"};
  return kNames[static_cast<size_t>(c)];
}

struct MemStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};
  int64_t total_current = 0;
  int64_t total_peak = 0;
  int64_t allocations = 0;  // every allocation so far (ARCHITECTURE invariant 4: none in the step loop after step 1)
  int64_t live_buffers = 0;  // allocated and not yet freed
};

class MemTracker {
 public:
  static MemTracker& instance();
  void on_alloc(MemCategory c, int64_t bytes);
  void on_free(MemCategory c, int64_t bytes);
  MemStats stats() const;
  // Peaks start again from the current values (e.g. to measure one phase).
  void reset_peaks();

 private:
  std::array<std::atomic<int64_t>, kNumMemCategories> current_{};
  std::array<std::atomic<int64_t>, kNumMemCategories> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
  std::atomic<int64_t> allocations_{0};
  std::atomic<int64_t> live_{0};
};

// An owning, aligned, tracked allocation. Move-only. Zero-filled on allocation.
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, MemCategory category);
  // Takes ownership of `bytes` at `data` allocated elsewhere (device memory); `free_fn(data)` returns it.
  // Counted under `category` like host buffers.
  using FreeFn = void (*)(void*);
  static Buffer adopt(void* data, size_t bytes, MemCategory category, FreeFn free_fn);
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void release();
  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::kWorkspace;
  FreeFn free_fn_ = nullptr;  // null: host memory from aligned_alloc
};

}  // namespace gpt
