#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gpt {
namespace {

Status errno_status(const std::string& what, const std::string& path) {
  const int err = errno;
  std::string msg = path + ": " + what + " failed: " + std::strerror(err);
  return err == ENOENT ? Status::not_found(msg) : Status::io_error(msg);
}

Status write_all(int fd, std::span<const char> bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("write", path);
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// Without this the rename itself may be lost on a crash even though the data was synced.
void fsync_parent_dir(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  fsync_dir(dir.empty() ? std::string(".") : dir.string());
}

}  // namespace

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some file systems do not allow opening directories
  ::fsync(fd);
  ::close(fd);
}

Status write_file_atomically(const std::string& path, std::initializer_list<std::span<const char>> pieces) {
  return write_file_atomically(path, std::span<const std::span<const char>>(pieces.begin(), pieces.size()));
}

Expected<std::string> atomic_write_target(const std::string& path) {
  if (path.empty()) return Status::invalid_argument("an empty path: expected a file name");
  namespace fs = std::filesystem;
  std::error_code ec;
  // Follow symbolic links to what they name (which may not exist yet: then that is the new file).
  fs::path at = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(at, ec)); ++hops) {
    const fs::path next = fs::read_symlink(at, ec);
    if (ec || hops == 40) return Status::invalid_argument(path + ": a symbolic link that cannot be followed");
    at = next.is_absolute() ? next : at.parent_path() / next;
  }
  const std::string target = at == fs::path(path) ? path : at.lexically_normal().string();
  if (!fs::exists(fs::symlink_status(target, ec))) return target;  // a new file (the open says what is wrong there)
  const fs::file_status st = fs::status(target, ec);
  if (ec || !fs::is_regular_file(st)) {
    const char* kind = fs::is_directory(st)                                 ? "a directory"
                       : fs::is_character_file(st) || fs::is_block_file(st) ? "a device"
                       : fs::is_fifo(st)                                    ? "a pipe"
                                                                            : "not a regular file";
    return Status::invalid_argument(path + (target == path ? "" : " (-> " + target + ")") + ": is " + kind +
                                    ", which writing a file here would replace; expected a file name");
  }
  return target;
}

Status write_file_atomically(const std::string& to, std::span<const std::span<const char>> pieces) {
  const Expected<std::string> target = atomic_write_target(to);
  if (!target) return target.status();
  const std::string& path = *target;
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_status("open for writing", tmp);
  Status st;
  for (std::span<const char> piece : pieces) {
    st = write_all(fd, piece, tmp);
    if (!st.is_ok()) break;
  }
  if (st.is_ok() && ::fsync(fd) != 0) st = errno_status("fsync", tmp);
  if (::close(fd) != 0 && st.is_ok()) st = errno_status("close", tmp);
  if (st.is_ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = errno_status("rename to " + path, tmp);
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  fsync_parent_dir(path);
  return Status::ok();
}

Status read_file(const std::string& path, std::string* out) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::not_found(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) return Status::invalid_argument(path + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno_status("open for reading", path);
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return errno_status("read", path);
  *out = std::move(buf).str();
  return Status::ok();
}

}  // namespace gpt
