// The Trainer's side of checkpoints: which slices this rank saves, restoring any checkpoint into this rank's
// regions (resharding is re-slicing: the flat unit layouts do not depend on strategy or world size), and
// checking a checkpoint against the run before anything is loaded.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint_writer.h"
#include "config/loader.h"
#include "core/check.h"
#include "train/trainer.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

std::string root_of(const RunConfig& cfg) {
  return cfg.checkpoint.dir.empty() ? (fs::path(cfg.run.out_dir) / "checkpoints").string() : cfg.checkpoint.dir;
}

}  // namespace

std::string Trainer::checkpoint_root() const { return root_of(config_); }

// The run's model shape against the one `reader`'s manifest records, key by key: "<key> is A but <what> <manifest>
// has B; <rule>". `shorter_block`: a smaller block_size passes too (the embed unit is wte then wpe's rows, so the
// run's is a prefix of the saved one: wpe cropped, as nanoGPT's crop_block_size).
static Status check_same_shape(const RunConfig& cfg, const GptShape& shape, const CheckpointReader& reader,
                               const std::string& what, const std::string& rule, bool shorter_block = false) {
  const GptShape& saved = reader.manifest().shape;
  const std::pair<const char*, std::pair<int, int>> dims[] = {
      {"model.n_layer", {shape.n_layer, saved.n_layer}},
      {"model.n_head", {shape.n_head, saved.n_head}},
      {"model.n_embd", {shape.n_embd, saved.n_embd}},
      {"model.block_size", {shape.block_size, saved.block_size}},
      {"model.vocab_size", {shape.vocab_size, saved.vocab_size}}};
  for (const auto& [key, v] : dims) {
    if (v.first != v.second && !(shorter_block && std::string_view(key) == "model.block_size" && v.first < v.second)) {
      const bool derived = std::string_view(key) == "model.vocab_size" && cfg.model.vocab_size == 0;
      return Status::invalid_argument(
          cfg.where(key) + ": " + key + " is " + std::to_string(v.first) +
          (derived ? " (0 in the config: the data's tokenizer's, or its largest id + 1)" : "") + " but " + what + " " +
          reader.manifest_path() + " has " + std::to_string(v.second) + "; " + rule);
    }
  }
  return Status::ok();
}

Expected<std::optional<CheckpointReader>> Trainer::open_init_from(const RunConfig& cfg, const GptShape& shape,
                                                                  Communicator& world) {
  const std::string& from = cfg.checkpoint.init_from;
  if (from.empty()) return std::optional<CheckpointReader>();
  // Rank 0 resolves a checkpoint root to its latest step, or a run's out_dir to its final model, so every rank reads
  // the same weights.
  std::string dir;
  if (world.rank() == 0) {
    namespace fs = std::filesystem;
    std::error_code ec;
    dir =
        resolve_checkpoint_dir(from);  // as given, else a root's latest, else as given (opening it says what is wrong)
    if (dir == from && !fs::exists(fs::path(from) / "manifest.json", ec) &&
        fs::exists(fs::path(from) / "model" / "manifest.json", ec)) {
      dir = (fs::path(from) / "model").string();
    }
  }
  dir = broadcast_string(world, dir);
  const std::string where = cfg.where("checkpoint.init_from") + ": checkpoint.init_from";
  auto reader = CheckpointReader::open(dir);
  if (!reader) return reader.status().with_context(where);
  GPT_RETURN_IF_ERROR(check_same_shape(cfg, shape, *reader, "checkpoint.init_from's",
                                       "the initial weights load only into the same model shape (or a smaller "
                                       "block_size: wpe cropped)",
                                       /*shorter_block=*/true));
  if (shape.block_size < reader->manifest().shape.block_size) {
    spdlog::info("checkpoint.init_from: block_size {} of the saved {}: wpe cropped to its first {} positions",
                 shape.block_size, reader->manifest().shape.block_size, shape.block_size);
  }
  return std::optional<CheckpointReader>(std::move(*reader));
}

// A run's first save retires every step directory of its checkpoint root after the step it saves (a resumed run's
// abandoned future). So a run that does not continue this root's own steps (it starts fresh, or resumes a checkpoint
// kept elsewhere) would delete the steps of the run that was there before: refused, with what to do instead. Rank 0
// looks, for every rank.
static Status check_root_is_ours(const RunConfig& cfg, Communicator& world, const std::string& resume_dir) {
  Status st;
  if (world.rank() == 0) {
    const std::string root = root_of(cfg);
    const std::string root_key = cfg.checkpoint.dir.empty() ? "run.out_dir" : "checkpoint.dir";
    std::error_code ec;
    // The step directory's parent, resolved (a relative path, "step_N/", a symbolic link into the root).
    bool ours = false;
    if (!resume_dir.empty()) {
      fs::path step = fs::weakly_canonical(fs::absolute(fs::path(resume_dir), ec), ec).lexically_normal();
      if (!step.has_filename()) step = step.parent_path();
      ours = !ec && fs::equivalent(step.parent_path(), fs::path(root), ec) && !ec;
    }
    if (fs::exists(root, ec) && !fs::is_directory(root, ec)) {  // found now, not at the first save after training
      st = Status::invalid_argument(cfg.where(root_key) + ": " + root_key + ": the checkpoint directory " + root +
                                    " exists and is not a directory");
    } else if (const std::string latest = ours ? std::string() : latest_checkpoint(root); !latest.empty()) {
      st = Status::failed_precondition(
          cfg.where(root_key) + ": " + root + " already holds the checkpoints of an earlier run (latest " +
          fs::path(latest).filename().string() + "), which this run" +
          (resume_dir.empty() ? std::string(", starting fresh,") : " (resuming " + resume_dir + ")") +
          " would replace at its first save: to continue that run, resume it (--resume auto); for a new one (a "
          "fine-tune too), give it its own " +
          root_key + ", or remove them");
    }
  }
  return agree(world, st, "checking checkpoint root " + root_of(cfg));
}

Expected<std::optional<CheckpointReader>> Trainer::open_resume(const RunConfig& cfg, const GptShape& shape,
                                                               Communicator& world) {
  const std::string& resume = cfg.checkpoint.resume;
  if (resume.empty()) {
    GPT_RETURN_IF_ERROR(check_root_is_ours(cfg, world, ""));
    return std::optional<CheckpointReader>();
  }
  // Rank 0 decides which directory is resumed, so every rank loads the same one (and takes the same branch): auto's
  // latest in the run's root; a step directory as given; a checkpoint root's latest, as init_from and sample take it.
  std::string dir;
  if (world.rank() == 0) dir = resume == "auto" ? latest_checkpoint(root_of(cfg)) : resolve_checkpoint_dir(resume);
  dir = broadcast_string(world, dir);
  if (dir.empty()) {  // auto, and nothing saved yet
    GPT_RETURN_IF_ERROR(check_root_is_ours(cfg, world, ""));
    spdlog::info("checkpoint.resume auto: no checkpoint in {} yet, starting from step 0", root_of(cfg));
    return std::optional<CheckpointReader>();
  }
  const std::string where = cfg.where("checkpoint.resume") + ": checkpoint.resume";
  auto reader = CheckpointReader::open(dir);
  if (!reader) return reader.status().with_context(where);
  const Manifest& m = reader->manifest();
  if (m.kind != "checkpoint") {
    return Status::invalid_argument(where + ": " + dir + " holds model weights only (kind \"" + m.kind +
                                    "\"), not a resumable checkpoint; resume from <checkpoint.dir>/step_*, or "
                                    "start from these weights with checkpoint.init_from");
  }
  if (resume != "auto") GPT_RETURN_IF_ERROR(check_root_is_ours(cfg, world, dir));
  GPT_RETURN_IF_ERROR(
      check_same_shape(cfg, shape, *reader, "the checkpoint", "a checkpoint resumes only the same model shape"));
  if (m.seed != cfg.run.seed) {
    return Status::invalid_argument(cfg.where("run.seed") + ": run.seed is " + std::to_string(cfg.run.seed) +
                                    " but the checkpoint " + reader->manifest_path() + " was trained with " +
                                    std::to_string(m.seed) + " (data order and dropout follow the seed); set " +
                                    "run.seed: " + std::to_string(m.seed) + " to continue it");
  }
  return std::optional<CheckpointReader>(std::move(*reader));
}

Status Trainer::read_local_slices(const CheckpointReader& r, int sections) {
  float* const dst[] = {params_->master(), optimizer_->m(), optimizer_->v()};
  const char* const names[] = {"master", "adam_m", "adam_v"};
  GPT_CHECK(sections >= 1 && sections <= 3);
  std::vector<float> staging;  // device backends: read into host memory, then copy over
  for (const MasterRegion& region : params_->regions()) {
    if (region.length == 0) continue;
    for (int s = 0; s < sections; ++s) {
      float* to = dst[s] + region.local_offset;
      if (!backend_->host_memory()) {
        staging.resize(region.length);
        to = staging.data();
      }
      GPT_RETURN_IF_ERROR(r.read(names[s], region.unit, region.begin, region.length, to));
      if (!backend_->host_memory()) {
        backend_->to_device(dst[s] + region.local_offset, to, region.length * sizeof(float));
      }
    }
  }
  return Status::ok();
}

Status Trainer::load_initial_weights(const CheckpointReader& r) {
  const auto t0 = std::chrono::steady_clock::now();
  GPT_RETURN_IF_ERROR(agree(world_, read_local_slices(r, 1), "reading " + r.dir())
                          .with_context(config_.where("checkpoint.init_from") + ": checkpoint.init_from"));
  params_->publish(0);
  // The ids the weights learned against and the ones this run's data holds: a different vocabulary of the same size
  // loads, but means other tokens.
  const std::string theirs = r.file_path(r.manifest().tokenizer);
  if (world_.rank() == 0 && tokenizer_) {
    auto saved = theirs.empty() ? Expected<data::Tokenizer>(Status::not_found("")) : data::Tokenizer::load(theirs);
    if (!saved) {
      spdlog::warn(
          "checkpoint.init_from: {} has no tokenizer.json (its data was tokenized elsewhere) but this run's "
          "data has one: make sure their token ids mean the same tokens",
          r.dir());
    } else if (!saved->same_ids(*tokenizer_)) {
      spdlog::warn(
          "checkpoint.init_from: {}'s tokenizer differs from this run's data's: the same ids are other "
          "tokens, so fine-tuning starts from weights that read them wrongly (prepare the data with the "
          "same vocabulary)",
          r.dir());
    }
  }
  spdlog::info(
      "initial weights from {} (a {} of step {}); training starts at step 0 with a fresh optimizer; this "
      "rank read {:.2f} MiB of shards in {:.3f} s",
      r.dir(), r.manifest().kind, r.manifest().step, static_cast<double>(r.bytes_read()) / (1 << 20),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return Status::ok();
}

Status Trainer::restore() {
  const auto t0 = std::chrono::steady_clock::now();
  const CheckpointReader& r = *resume_;
  const Manifest& m = r.manifest();
  // Each rank reads its own slices: one that fails (a corrupt shard) fails every rank, here, before the collectives
  // that follow (publish's all-gathers; on GPUs also NCCL's teardown when the Trainer goes, which waits for the
  // node's other ranks).
  Status read = read_local_slices(r, 3);
  if (read.is_ok()) read = train_.restore({m.loader_batch_index, m.global_batch});
  GPT_RETURN_IF_ERROR(agree(world_, read.with_context("checkpoint.resume"), "resuming from " + r.dir()));
  optimizer_->set_steps_taken(m.adam_steps);
  params_->publish(m.adam_steps);  // the bf16 parameters as the uninterrupted run rounded them at this step
  start_step_ = m.step;
  spdlog::info("resumed from {} (step {}, saved by {} on {} rank(s)); this rank read {:.2f} MiB of shards in {:.3f} s",
               r.dir(), m.step, m.strategy, m.world_size, static_cast<double>(r.bytes_read()) / (1 << 20),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  resume_.reset();
  return Status::ok();
}

std::vector<SaveSlice> Trainer::save_slices() const {
  // Who writes what: sharded strategies write their own shards (hybrid: the first replica only); replicated
  // ones (single, ddp) split every unit evenly over the ranks, so saving is parallel either way.
  std::vector<SaveSlice> slices;
  const bool first_replica = replicate_group_ == nullptr || replicate_group_->rank() == 0;
  const bool sharded = params_->strategy() >= Strategy::kZero1;
  for (const MasterRegion& region : params_->regions()) {
    if (sharded) {
      if (first_replica && region.length > 0) {
        slices.push_back({region.unit, region.begin, region.length, region.local_offset});
      }
      continue;
    }
    const int64_t n = region.length, parts = world_.size();
    const int64_t per = (n + parts - 1) / parts, begin = std::min(n, per * world_.rank());
    const int64_t length = std::min(n, begin + per) - begin;
    if (length > 0) slices.push_back({region.unit, region.begin + begin, length, region.local_offset + begin});
  }
  return slices;
}

void Trainer::allocate_save_copy() {
  int64_t total = 0;
  for (const SaveSlice& s : save_slices()) total += s.length;
  save_copy_size_ = static_cast<size_t>(total * 3);
  save_copy_.reset(new float[save_copy_size_]);
  std::fill_n(save_copy_.get(), save_copy_size_, 0.0f);  // touched now, so no page faults while the loop waits
}

Status Trainer::save(int64_t steps_done, bool model_only) {
  const auto& t = config_.training;
  SaveRequest req;
  Manifest& m = req.manifest;
  m.kind = model_only ? "model" : "checkpoint";
  m.step = steps_done;
  m.tokens_seen = steps_done * config_.global_batch() * shape_.block_size;
  m.shape = shape_;
  if (!model_only) {
    m.sections = {"master", "adam_m", "adam_v"};
    m.seed = config_.run.seed;
    m.loader_batch_index = train_.state().batch_index;
    m.global_batch = config_.global_batch();
    m.sampling = config_.data.sampling;
    m.adam_steps = optimizer_->steps_taken();
    m.beta1 = t.beta1;
    m.beta2 = t.beta2;
    m.eps = t.eps;
    m.weight_decay = t.weight_decay;
    m.strategy = strategy_label();
    m.world_size = world_.size();
    m.shard_group_size = shard_group_ ? shard_group_->size() : world_.size();
    m.param_dtype = config_.parallel.param_dtype;
    m.reduce_dtype = config_.parallel.reduce_dtype;
    m.config = "config.yaml";
    req.config_yaml = to_yaml(config_);
    req.sections = {params_->master(), optimizer_->m(), optimizer_->v()};
    req.keep_last = config_.checkpoint.keep_last;
  } else {
    req.sections = {params_->master()};
    req.update_latest = false;
  }
  if (tokenizer_) req.tokenizer_json = tokenizer_->to_json();
  req.slices = save_slices();
  const std::string root = model_only ? config_.run.out_dir : checkpoint_root();
  const std::string name = model_only ? "model" : step_dir_name(steps_done);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds_since = [](auto t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  const bool async = !model_only && config_.checkpoint.async;
  if (!async && backend_->host_memory()) {
    GPT_RETURN_IF_ERROR(save_checkpoint(*save_comm_, root, name, req));
    if (!model_only)
      spdlog::info("checkpoint step {} saved to {}/{} in {:.2f} s", steps_done, root, name, seconds_since(t0));
    return Status::ok();
  }
  GPT_RETURN_IF_ERROR(wait_for_save());
  const double waited = seconds_since(t0);
  // The copy into host memory (async saves; every save from a device): sections back to back, each holding
  // the slices in order.
  int64_t total = 0;
  for (const SaveSlice& s : req.slices) total += s.length;
  GPT_CHECK(save_copy_size_ >= static_cast<size_t>(total) * req.sections.size());
  for (size_t k = 0; k < req.sections.size(); ++k) {
    float* dst = save_copy_.get() + k * static_cast<size_t>(total);
    for (const SaveSlice& s : req.slices) {
      backend_->to_host(dst, req.sections[k] + s.local_offset, s.length * sizeof(float));
      dst += s.length;
    }
  }
  int64_t offset = 0;
  for (SaveSlice& s : req.slices) {
    s.local_offset = offset;
    offset += s.length;
  }
  for (size_t k = 0; k < req.sections.size(); ++k) req.sections[k] = save_copy_.get() + k * static_cast<size_t>(total);
  if (!async) {
    GPT_RETURN_IF_ERROR(save_checkpoint(*save_comm_, root, name, req));
    if (!model_only)
      spdlog::info("checkpoint step {} saved to {}/{} in {:.2f} s", steps_done, root, name, seconds_since(t0));
    return Status::ok();
  }
  const double blocked = seconds_since(t0);
  save_thread_ = std::thread([this, req = std::move(req), root, name, steps_done, blocked, waited] {
    const auto start = std::chrono::steady_clock::now();
    save_status_ = save_checkpoint(*save_comm_, root, name, req);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (save_status_.is_ok()) {
      spdlog::info(
          "checkpoint step {} saved to {}/{}: training blocked {:.3f} s ({:.3f} s waiting for the previous "
          "save, then the copy), written in the background in {:.2f} s",
          steps_done, root, name, blocked, waited, s);
    }
  });
  return Status::ok();
}

Status Trainer::wait_for_save() {
  if (save_thread_.joinable()) save_thread_.join();
  Status st = save_status_;
  save_status_ = Status::ok();
  return st;
}

}  // namespace gpt
