#include "checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/crc32c.h"
#include "checkpoint/json_text.h"
#include "core/atomic_file.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// Reads exactly n bytes at `offset` of `path`.
Status pread_exact(const std::string& path, int64_t offset, size_t n, void* dst) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::io_error(path + ": cannot open: " + std::strerror(errno));
  size_t done = 0;
  Status st;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(dst) + done, n - done, offset + static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      st = Status::corruption(path + ": short read at byte " + std::to_string(offset + static_cast<int64_t>(done)) +
                              (got < 0 ? std::string(": ") + std::strerror(errno) : ": the file is truncated"));
      break;
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return st;
}

}  // namespace

Expected<CheckpointReader> CheckpointReader::open(const std::string& dir) {
  CheckpointReader r;
  r.dir_ = dir;
  const std::string mpath = r.manifest_path();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::not_found(dir + ": no such checkpoint directory");
  std::string text;
  Status st = read_file(mpath, &text);
  if (!st.is_ok()) {
    return Status::not_found(dir + " is not a complete gpt-train checkpoint or model directory: " + st.message());
  }
  GPT_ASSIGN_OR_RETURN(r.manifest_, parse_manifest(text, mpath));
  r.layout_ = ModelLayout::build(r.manifest_.shape);
  for (const ShardFile& f : r.manifest_.shards) {
    const std::string path = (fs::path(dir) / f.file).string();
    if (!fs::exists(path, ec)) {
      return Status::not_found(path + ": shard file missing (the manifest " + mpath + " lists it)");
    }
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (ec) return Status::io_error(path + ": cannot read its size: " + ec.message());
    const int64_t want = f.bytes(r.manifest_.sections.size());
    if (size != want) {
      return Status::corruption(path + ": " + std::to_string(size) + " bytes, the manifest says " +
                                std::to_string(want) + (size < want ? " (truncated)" : ""));
    }
  }
  // The tokenizer and config (small files, read whole): a hand-edited or damaged one would otherwise decode a
  // model's ids into the wrong symbols, or resume under another config, without a word.
  for (const auto& [name, crc] : {std::pair{r.manifest_.tokenizer, r.manifest_.tokenizer_crc},
                                  std::pair{r.manifest_.config, r.manifest_.config_crc}}) {
    const std::string path = r.file_path(name);
    if (!crc || !fs::exists(path, ec)) continue;  // a missing one: the caller that needs it says so
    std::string bytes;
    GPT_RETURN_IF_ERROR(read_file(path, &bytes));
    if (const uint32_t got = crc32c(bytes.data(), bytes.size()); got != *crc) {
      return Status::corruption(path + ": checksum mismatch (crc32c " + hex32(got) + ", the manifest " + mpath +
                                " says " + hex32(*crc) + ")");
    }
  }
  if (r.manifest_.version == 1) GPT_RETURN_IF_ERROR(r.verify());  // one CRC over the whole file
  return r;
}

std::string CheckpointReader::manifest_path() const { return (fs::path(dir_) / "manifest.json").string(); }

std::string CheckpointReader::file_path(const std::string& name) const {
  return name.empty() ? std::string() : (fs::path(dir_) / name).string();
}

Status CheckpointReader::read_slice(const ShardFile& f, size_t slice, int section, std::vector<float>* out) const {
  int64_t offset = section * f.total_elements();
  for (size_t i = 0; i < slice; ++i) offset += f.slices[i].length;
  const ShardSlice& s = f.slices[slice];
  const std::string path = (fs::path(dir_) / f.file).string();
  out->resize(static_cast<size_t>(s.length));
  const size_t bytes = static_cast<size_t>(s.length) * sizeof(float);
  GPT_RETURN_IF_ERROR(pread_exact(path, offset * 4, bytes, out->data()));
  bytes_read_ += static_cast<int64_t>(bytes);
  if (!s.crc.empty()) {
    const uint32_t got = crc32c(out->data(), bytes);
    if (got != s.crc[static_cast<size_t>(section)]) {
      return Status::corruption(path + ": checksum mismatch in section " + manifest_.sections[section] + " of unit '" +
                                layout_.units[s.unit].name + "' elements [" + std::to_string(s.begin) + ", " +
                                std::to_string(s.begin + s.length) + "): crc32c " + hex32(got) +
                                ", the manifest says " + hex32(s.crc[static_cast<size_t>(section)]));
    }
  }
  return Status::ok();
}

Status CheckpointReader::read(const std::string& section, int unit, int64_t begin, int64_t length, float* dst) const {
  const int sec = manifest_.section_index(section);
  if (sec < 0) return Status::not_found(manifest_path() + ": no section '" + section + "' in this " + manifest_.kind);
  const int64_t end = begin + length;
  int64_t found = 0;
  std::vector<float> buf;
  for (const ShardFile& f : manifest_.shards) {
    for (size_t i = 0; i < f.slices.size(); ++i) {
      const ShardSlice& s = f.slices[i];
      const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.begin + s.length);
      if (s.unit != unit || lo >= hi) continue;
      GPT_RETURN_IF_ERROR(read_slice(f, i, sec, &buf));
      std::memcpy(dst + (lo - begin), buf.data() + (lo - s.begin), static_cast<size_t>(hi - lo) * sizeof(float));
      found += hi - lo;
    }
  }
  if (found != length) {  // parse_manifest checked coverage, so only a caller's range past the unit gets here
    return Status::invalid_argument(manifest_path() + ": unit " + std::to_string(unit) + " has no elements [" +
                                    std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
  return Status::ok();
}

Status CheckpointReader::verify() const {
  bytes_read_ = 0;  // what this reads (open() reads a version 1 model's file too)
  for (const ShardFile& f : manifest_.shards) {
    const std::string path = (fs::path(dir_) / f.file).string();
    if (f.file_crc) {
      std::string bytes;
      GPT_RETURN_IF_ERROR(read_file(path, &bytes));
      bytes_read_ += static_cast<int64_t>(bytes.size());
      const uint32_t crc = crc32c(bytes.data(), bytes.size());
      if (crc != *f.file_crc) {
        return Status::corruption(path + ": checksum mismatch (crc32c " + hex32(crc) + ", the manifest says " +
                                  hex32(*f.file_crc) + ")");
      }
      continue;
    }
    std::vector<float> buf;
    for (size_t sec = 0; sec < manifest_.sections.size(); ++sec) {
      for (size_t i = 0; i < f.slices.size(); ++i) GPT_RETURN_IF_ERROR(read_slice(f, i, static_cast<int>(sec), &buf));
    }
  }
  return Status::ok();
}

}  // namespace gpt
