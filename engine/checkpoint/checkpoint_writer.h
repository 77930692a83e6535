// Writing a checkpoint (or a model directory) from every rank at once, atomically. Collective over `world`:
// every rank calls save_checkpoint with the same manifest fields and its own slices.
//
//   1. rank 0 removes half-written leftovers (<root>/.tmp-*) and creates <root>/.tmp-<name>/;
//   2. every rank with slices writes shard_<rank>.bin there (temporary name, fsync, rename), no gathering;
//   3. the slices' places and CRC-32Cs are all-gathered; rank 0 writes config, tokenizer and, last, the
//      manifest, then renames the directory to <root>/<name>, fsyncs <root>, updates <root>/latest
//      atomically, removes step directories after this step (left by a run that was abandoned and resumed
//      from an earlier checkpoint) and the oldest beyond keep_last, by step number; each is renamed to a
//      .tmp- name before it is deleted.
// A crash at any moment leaves <root>/<name> either absent or complete, and `latest` naming a complete
// checkpoint. Any rank's failure fails the save on every rank (the failing rank's error, others name it).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "comm/communicator.h"
#include "core/status.h"

namespace gpt {

// Elements [begin, begin + length) of `unit`, found at `local_offset` of each section's local buffer.
struct SaveSlice {
  int unit = 0;
  int64_t begin = 0, length = 0;
  int64_t local_offset = 0;
};

struct SaveRequest {
  Manifest manifest;                   // every field but `shards`, the same on every rank
  std::vector<SaveSlice> slices;       // this rank's share (at most one per unit); empty: no shard file
  std::vector<const float*> sections;  // one local buffer per manifest.sections entry
  std::string tokenizer_json;          // written by rank 0 when non-empty
  std::string config_yaml;             // written by rank 0 when non-empty
  bool update_latest = true;           // write <root>/latest
  int keep_last = 0;                   // step directories kept under <root> (0: all)
  // <root> is gpt-train's own checkpoint directory: stale ".tmp-*" entries in it are removed first, and step
  // directories after this one (or beyond keep_last) retired after. false: a directory of the user's (save_model's
  // parent, e.g. `checkpoint import --out`), where only this save's own temporary directory is touched.
  bool manage_root = true;
};

// "step_00001000".
std::string step_dir_name(int64_t step);

[[nodiscard]] Status save_checkpoint(Communicator& world, const std::string& root, const std::string& name,
                                     const SaveRequest& request);

// The directory <root>/latest names; without a usable `latest`, the newest step directory with a manifest;
// "" when there is none.
std::string latest_checkpoint(const std::string& root);

// DIR when it holds a manifest.json; else, when DIR is a checkpoint root, its latest step directory (as above); else
// DIR (whose reader then says what is wrong).
std::string resolve_checkpoint_dir(const std::string& dir);

}  // namespace gpt
