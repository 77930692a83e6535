// A file written piece by piece that is never seen half-written: open() creates `path + ".tmp"`, append()
// writes through a fixed-size buffer (memory stays bounded however large the file), commit() flushes, fsyncs,
// closes and renames the temporary over `path` (then fsyncs the directory). A writer destroyed without a
// successful commit() removes its temporary, so an error or an exception leaves `path` as it was.
// For content that is already in memory as a few pieces, core/atomic_file.h's write_file_atomically is simpler.
// Errors name the temporary's path and the failing call. A writer is used from one thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace gpt {

class AtomicFileWriter {
 public:
  static Expected<AtomicFileWriter> open(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  [[nodiscard]] Status append(std::span<const char> bytes);
  // REQUIRES: every append() succeeded. After commit() (whatever it returns) the writer takes no more appends.
  [[nodiscard]] Status commit();
  // Bytes appended so far.
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  AtomicFileWriter() = default;
  [[nodiscard]] Status flush();
  void abandon();  // closes and removes the temporary

  static constexpr size_t kBufferBytes = size_t{1} << 20;
  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<char> buf_;
  int64_t size_ = 0;
};

}  // namespace gpt
