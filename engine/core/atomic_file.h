// Writing a file so that it is never seen half-written: the bytes go to `path + ".tmp"`, are fsynced, and
// the temporary is renamed over `path` (then the directory is fsynced so the rename survives a crash).
// Readers see either the old file or the complete new one. Errors name the path and the failing call.
#pragma once

#include <initializer_list>
#include <span>
#include <string>

#include "core/status.h"

namespace gpt {

// The file an atomic write of `path` replaces: `path` itself when it is a regular file or does not exist yet, the
// file a symbolic link names (written through, as a plain write would), and an error that names `path` when it is
// empty, or names a directory, a device, a pipe or a socket (which the rename would replace with a file).
[[nodiscard]] Expected<std::string> atomic_write_target(const std::string& path);

// Writes the pieces back to back as the whole content of `path` (atomic_write_target's).
[[nodiscard]] Status write_file_atomically(const std::string& path,
                                           std::initializer_list<std::span<const char>> pieces);
[[nodiscard]] Status write_file_atomically(const std::string& path, std::span<const std::span<const char>> pieces);

// Makes a rename or a new entry in `dir` durable (best effort where directories cannot be opened).
void fsync_dir(const std::string& dir);

// Reads the whole file into *out. NotFound if it does not exist, IoError otherwise; both name the path.
[[nodiscard]] Status read_file(const std::string& path, std::string* out);

}  // namespace gpt
