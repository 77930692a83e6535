#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/check.h"

namespace gpt {

MemTracker& MemTracker::instance() {
  static MemTracker tracker;
  return tracker;
}

static void raise_peak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t prev = peak.load(std::memory_order_relaxed);
  while (prev < value && !peak.compare_exchange_weak(prev, value, std::memory_order_relaxed)) {
  }
}

void MemTracker::on_alloc(MemCategory c, int64_t bytes) {
  const size_t i = static_cast<size_t>(c);
  raise_peak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_peak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  allocations_.fetch_add(1, std::memory_order_relaxed);
  live_.fetch_add(1, std::memory_order_relaxed);
}

void MemTracker::on_free(MemCategory c, int64_t bytes) {
  current_[static_cast<size_t>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
  live_.fetch_sub(1, std::memory_order_relaxed);
}

MemStats MemTracker::stats() const {
  MemStats s;
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    s.current[i] = current_[i].load();
    s.peak[i] = peak_[i].load();
  }
  s.total_current = total_current_.load();
  s.total_peak = total_peak_.load();
  s.allocations = allocations_.load();
  s.live_buffers = live_.load();
  return s;
}

void MemTracker::reset_peaks() {
  for (size_t i = 0; i < kNumMemCategories; ++i) peak_[i].store(current_[i].load());
  total_peak_.store(total_current_.load());
}

Buffer::Buffer(size_t bytes, MemCategory category) : bytes_(bytes), category_(category) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
  MemTracker::instance().on_alloc(category_, static_cast<int64_t>(bytes_));
}

Buffer Buffer::adopt(void* data, size_t bytes, MemCategory category, FreeFn free_fn) {
  GPT_CHECK(free_fn != nullptr);
  Buffer b;
  if (data == nullptr) return b;
  b.data_ = data;
  b.bytes_ = bytes;
  b.category_ = category;
  b.free_fn_ = free_fn;
  MemTracker::instance().on_alloc(category, static_cast<int64_t>(bytes));
  return b;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    category_ = o.category_;
    free_fn_ = std::exchange(o.free_fn_, nullptr);
  }
  return *this;
}

void Buffer::release() {
  if (data_ == nullptr) return;
  MemTracker::instance().on_free(category_, static_cast<int64_t>(bytes_));
  if (free_fn_ != nullptr) {
    free_fn_(data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  free_fn_ = nullptr;
  bytes_ = 0;
}

}  // namespace gpt
