#include "checkpoint/atomic_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/atomic_file.h"

namespace gpt {

namespace {

Status errno_status(const std::string& what, const std::string& path) {
  return Status::io_error(path + ": " + what + " failed: " + std::strerror(errno));
}

}  // namespace

Expected<AtomicFileWriter> AtomicFileWriter::open(const std::string& path) {
  Expected<std::string> target = atomic_write_target(path);
  if (!target) return target.status();
  AtomicFileWriter w;
  w.path_ = *target;
  w.tmp_ = w.path_ + ".tmp";
  w.fd_ = ::open(w.tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return errno_status("open for writing", w.tmp_);
  w.buf_.reserve(kBufferBytes);
  return w;
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      fd_(std::exchange(other.fd_, -1)),
      buf_(std::move(other.buf_)),
      size_(other.size_) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    abandon();
    path_ = std::move(other.path_);
    tmp_ = std::move(other.tmp_);
    fd_ = std::exchange(other.fd_, -1);
    buf_ = std::move(other.buf_);
    size_ = other.size_;
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
}

Status AtomicFileWriter::flush() {
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("write", tmp_);
    }
    done += static_cast<size_t>(n);
  }
  buf_.clear();
  return Status::ok();
}

Status AtomicFileWriter::append(std::span<const char> bytes) {
  if (fd_ < 0) return Status::failed_precondition(tmp_ + ": append after commit or a failed write");
  while (!bytes.empty()) {
    const size_t n = std::min(bytes.size(), kBufferBytes - buf_.size());
    buf_.insert(buf_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    bytes = bytes.subspan(n);
    size_ += static_cast<int64_t>(n);
    if (buf_.size() == kBufferBytes) {
      Status st = flush();
      if (!st.is_ok()) {
        abandon();
        return st;
      }
    }
  }
  return Status::ok();
}

Status AtomicFileWriter::commit() {
  if (fd_ < 0) return Status::failed_precondition(tmp_ + ": commit after commit or a failed write");
  Status st = flush();
  if (st.is_ok() && ::fsync(fd_) != 0) st = errno_status("fsync", tmp_);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 && st.is_ok()) st = errno_status("close", tmp_);
  if (st.is_ok() && std::rename(tmp_.c_str(), path_.c_str()) != 0) st = errno_status("rename to " + path_, tmp_);
  if (!st.is_ok()) {
    ::unlink(tmp_.c_str());
    return st;
  }
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  fsync_dir(dir.empty() ? std::string(".") : dir.string());
  return Status::ok();
}

}  // namespace gpt
