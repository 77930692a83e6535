#include "checkpoint/checkpoint_writer.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "checkpoint/crc32c.h"
#include "core/atomic_file.h"
#include "core/check.h"
#include "core/test_fault.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// Test hooks (tests/apps/checkpoint_faults_test.sh), from GPT_TRAIN_FAULT:
//   kill_during_save:<rank>:<step>  that rank SIGKILLs itself right after writing its shard of that step;
//   hang_during_save:<rank>:<step>  that rank stops there (sleeps for ever: a file system that never returns);
//   file_size_limit:<bytes>         from the first save on, the kernel refuses to grow any file past <bytes>
//                                   (RLIMIT_FSIZE: write() fails with EFBIG), as a full disk would; set here
//                                   rather than by the shell's ulimit, which MPI's start-up files would hit.
void maybe_limit_file_size(const std::optional<TestFault>& fault) {
  if (!fault || !fault->is("file_size_limit", 1)) return;
  ::signal(SIGXFSZ, SIG_IGN);
  const auto bytes = static_cast<rlim_t>(fault->args[0]);
  const rlimit limit{bytes, bytes};
  ::setrlimit(RLIMIT_FSIZE, &limit);
}

void maybe_inject_kill(const std::optional<TestFault>& fault, int rank, int64_t step) {
  if (fault && fault->is("kill_during_save", 2) && fault->args[0] == rank && fault->args[1] == step) ::raise(SIGKILL);
  if (fault && fault->is("hang_during_save", 2) && fault->args[0] == rank && fault->args[1] == step) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

Status remove_tree(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) return Status::io_error(p.string() + ": cannot remove: " + ec.message());
  return Status::ok();
}

// Removes a step directory without ever leaving one that looks complete but is not: renamed to a .tmp-
// name first (what a crash leaves is cleaned up by the next save), then deleted.
Status retire(const fs::path& dir) {
  const fs::path doomed = dir.parent_path() / (".tmp-del-" + dir.filename().string());
  std::error_code ec;
  fs::rename(dir, doomed, ec);
  if (ec) return Status::io_error(dir.string() + ": cannot remove: " + ec.message());
  return remove_tree(doomed);
}

// The step of "step_00001000", if the name is one.
std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// The step directories under root (with a manifest when `complete`), by step.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const fs::path& root, bool complete) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto step = step_of(entry.path().filename().string());
    if (step && entry.is_directory(ec) && (!complete || fs::exists(entry.path() / "manifest.json", ec))) {
      out.emplace_back(*step, entry.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rank 0, phase 1.
Status prepare_tmp(const fs::path& root, const fs::path& tmp, bool manage_root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status::io_error(root.string() + ": cannot create checkpoint directory: " + ec.message());
  if (manage_root) {
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      if (entry.path().filename().string().rfind(".tmp-", 0) == 0) GPT_RETURN_IF_ERROR(remove_tree(entry.path()));
    }
    if (ec) return Status::io_error(root.string() + ": cannot list: " + ec.message());
  } else if (fs::exists(tmp, ec)) {
    GPT_RETURN_IF_ERROR(remove_tree(tmp));  // this save's own, left by one that was killed
  }
  fs::create_directory(tmp, ec);
  if (ec) return Status::io_error(tmp.string() + ": cannot create: " + ec.message());
  return Status::ok();
}

// Phase 2: this rank's shard file; fills the slices' CRCs.
Status write_shard(const fs::path& path, const SaveRequest& req, std::vector<ShardSlice>* slices) {
  std::vector<std::span<const char>> pieces;
  for (const SaveSlice& s : req.slices) slices->push_back({s.unit, s.begin, s.length, {}});
  for (const float* section : req.sections) {
    for (size_t i = 0; i < req.slices.size(); ++i) {
      const SaveSlice& s = req.slices[i];
      const char* p = reinterpret_cast<const char*>(section + s.local_offset);
      const size_t bytes = static_cast<size_t>(s.length) * sizeof(float);
      pieces.emplace_back(p, bytes);
      (*slices)[i].crc.push_back(crc32c(p, bytes));
    }
  }
  return write_file_atomically(path.string(), pieces);
}

// Rank 0, phase 3: everything but the shards, then the rename into place.
Status finish(const fs::path& root, const fs::path& tmp, const std::string& name, const SaveRequest& req,
              const Manifest& m) {
  if (!req.tokenizer_json.empty()) {
    GPT_RETURN_IF_ERROR(
        write_file_atomically((tmp / m.tokenizer).string(), {std::span<const char>(req.tokenizer_json)}));
  }
  if (!req.config_yaml.empty()) {
    GPT_RETURN_IF_ERROR(write_file_atomically((tmp / m.config).string(), {std::span<const char>(req.config_yaml)}));
  }
  const std::string json = manifest_to_json(m);
  GPT_RETURN_IF_ERROR(write_file_atomically((tmp / "manifest.json").string(), {std::span<const char>(json)}));
  const fs::path final_dir = root / name;
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {  // saving the same step again (a re-run): move the old one out of the way
    const fs::path old = root / (".tmp-old-" + name);
    fs::rename(final_dir, old, ec);
    if (ec) return Status::io_error(final_dir.string() + ": cannot replace: " + ec.message());
    GPT_RETURN_IF_ERROR(remove_tree(old));
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return Status::io_error(tmp.string() + ": cannot rename to " + final_dir.string() + ": " + ec.message());
  fsync_dir(root.string());
  if (req.update_latest) {
    GPT_RETURN_IF_ERROR(write_file_atomically((root / "latest").string(), {std::span<const char>(name)}));
  }
  const auto step = step_of(name);
  if (!step || !req.manage_root) return Status::ok();  // a model directory, or a directory of the user's
  // Steps after this one belong to a run that was abandoned and resumed from an earlier checkpoint: stale.
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& [s, dir] : step_dirs(root, /*complete=*/false)) {
    if (s > *step) GPT_RETURN_IF_ERROR(retire(dir));
    if (s < *step) older.emplace_back(s, dir);
  }
  if (req.keep_last > 0) {  // the newest keep_last, this one included
    const size_t keep_others = static_cast<size_t>(req.keep_last - 1);
    for (size_t i = 0; i + keep_others < older.size(); ++i) GPT_RETURN_IF_ERROR(retire(older[i].second));
  }
  return Status::ok();
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string latest_checkpoint(const std::string& root) {
  std::string name;
  if (read_file((fs::path(root) / "latest").string(), &name).is_ok()) {
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    const fs::path dir = fs::path(root) / name;
    std::error_code ec;
    if (!name.empty() && name.find('/') == std::string::npos && fs::exists(dir / "manifest.json", ec)) {
      return dir.string();
    }
    const auto steps = step_dirs(root, /*complete=*/true);
    if (!steps.empty()) {
      spdlog::warn("{}/latest names '{}', which is not a complete step directory there; taking the newest that is, {}",
                   root, name, steps.back().second.filename().string());
    }
    return steps.empty() ? std::string() : steps.back().second.string();
  }
  // No `latest` (a crash between the rename and its update, or a hand-made root): the newest complete step directory.
  const auto steps = step_dirs(root, /*complete=*/true);
  return steps.empty() ? std::string() : steps.back().second.string();
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "manifest.json", ec)) return dir;
  const std::string latest = latest_checkpoint(dir);
  return latest.empty() ? dir : latest;
}

Status save_checkpoint(Communicator& world, const std::string& root_dir, const std::string& name,
                       const SaveRequest& req) {
  GPT_CHECK(req.sections.size() == req.manifest.sections.size());
  const fs::path root(root_dir), tmp = root / (".tmp-" + name);
  const int rank = world.rank();
  const std::string what = "saving checkpoint " + (root / name).string();
  const std::optional<TestFault> fault = test_fault();
  maybe_limit_file_size(fault);
  GPT_RETURN_IF_ERROR(agree(world, rank == 0 ? prepare_tmp(root, tmp, req.manage_root) : Status::ok(), what));

  char file[32];
  std::snprintf(file, sizeof(file), "shard_%05d.bin", rank);
  std::vector<ShardSlice> mine;
  Status st;
  if (!req.slices.empty()) {
    st = write_shard(tmp / file, req, &mine);
    if (!st.is_ok()) st = st.with_context(what);
  }
  if (st.is_ok()) maybe_inject_kill(fault, rank, req.manifest.step);
  // A save that fails after the temporary directory exists leaves nothing behind: once every rank has agreed on the
  // failure (so none is still writing into it), rank 0 removes it (a full disk would otherwise keep the partial
  // shards until the next save). Not once it holds its manifest: it is complete then, and finish() may already have
  // removed the step it was to replace (a rename that failed after), so it is the one copy to recover by hand.
  const auto discard = [&](Status failed) {
    std::error_code ec;
    if (rank == 0 && !fs::exists(tmp / "manifest.json", ec)) fs::remove_all(tmp, ec);  // best effort
    return failed;
  };
  if (Status agreed = agree(world, st, what); !agreed.is_ok()) return discard(agreed);

  // Where every rank's slices went: per unit, (begin, length) as int64 halves and one CRC per section.
  const int n_units = static_cast<int>(ModelLayout::build(req.manifest.shape).units.size());
  const size_t n_sec = req.sections.size(), per_unit = 4 + n_sec;
  std::vector<int32_t> meta(static_cast<size_t>(n_units) * per_unit, 0);
  for (const ShardSlice& s : mine) {
    GPT_CHECK_MSG(meta[static_cast<size_t>(s.unit) * per_unit + 2] == 0 && meta[s.unit * per_unit + 3] == 0,
                  "at most one slice per unit and rank");
    int32_t* row = &meta[static_cast<size_t>(s.unit) * per_unit];
    std::memcpy(row, &s.begin, 8);
    std::memcpy(row + 2, &s.length, 8);
    for (size_t k = 0; k < n_sec; ++k) std::memcpy(row + 4 + k, &s.crc[k], 4);
  }
  std::vector<int32_t> all(meta.size() * static_cast<size_t>(world.size()));
  world.all_gather(meta.data(), all.data(), static_cast<int64_t>(meta.size()), DType::kI32).wait();

  st = Status::ok();
  if (rank == 0) {
    Manifest m = req.manifest;
    m.shards.clear();
    if (!req.tokenizer_json.empty()) {
      m.tokenizer = "tokenizer.json";
      m.tokenizer_crc = crc32c(req.tokenizer_json.data(), req.tokenizer_json.size());
    }
    if (!req.config_yaml.empty()) {
      m.config = "config.yaml";
      m.config_crc = crc32c(req.config_yaml.data(), req.config_yaml.size());
    }
    for (int r = 0; r < world.size(); ++r) {
      ShardFile f;
      std::snprintf(file, sizeof(file), "shard_%05d.bin", r);
      f.file = file;
      f.rank = r;
      for (int u = 0; u < n_units; ++u) {
        const int32_t* row = &all[(static_cast<size_t>(r) * n_units + u) * per_unit];
        ShardSlice s;
        s.unit = u;
        std::memcpy(&s.begin, row, 8);
        std::memcpy(&s.length, row + 2, 8);
        if (s.length == 0) continue;
        s.crc.resize(n_sec);
        for (size_t k = 0; k < n_sec; ++k) std::memcpy(&s.crc[k], row + 4 + k, 4);
        f.slices.push_back(std::move(s));
      }
      if (!f.slices.empty()) m.shards.push_back(std::move(f));
    }
    st = finish(root, tmp, name, req, m);
    if (!st.is_ok()) st = st.with_context(what);
  }
  Status agreed = agree(world, st, what);
  return agreed.is_ok() ? agreed : discard(agreed);  // a finished save's rename took tmp away already
}

}  // namespace gpt
