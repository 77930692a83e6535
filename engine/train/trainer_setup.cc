// Trainer construction: the config checked across ranks, the data and tokenizer, the plan held to the device's
// free memory, the model, parameters and optimizer built, and the state initialised (trainer.cc runs the steps).
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string_view>
#include <thread>

#include "checkpoint/manifest.h"
#include "config/loader.h"
#include "core/atomic_file.h"
#include "core/stop_signal.h"
#include "core/test_fault.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// The tokenizer named by data.tokenizer, else tokenizer.json beside the first train shard if present. The
// tokenizer.json files prepare wrote beside the train and val shards say what their ids mean, so each must agree with
// it: shards prepared with different vocabularies would mix ids that mean different tokens, and a data.tokenizer
// other than theirs would read them as other tokens (and be saved as the model's). `found` gets its path.
Expected<std::optional<data::Tokenizer>> find_tokenizer(const RunConfig& cfg, const data::DataLoader& train,
                                                        const data::DataLoader* val, std::string* found) {
  std::optional<data::Tokenizer> ref;
  *found = cfg.data.tokenizer;
  if (!found->empty()) {
    auto tok = data::Tokenizer::load(*found);
    if (!tok) return tok.status().with_context(cfg.where("data.tokenizer") + ": data.tokenizer");
    ref.emplace(std::move(*tok));
  }
  std::vector<fs::path> seen;  // each directory once (a data set is often hundreds of shards in one)
  for (const data::DataLoader* split : {&train, val}) {
    if (split == nullptr) continue;  // no data.val
    for (const auto& shard : split->shards()) {
      const fs::path dir = fs::path(shard.path()).parent_path();
      if (std::find(seen.begin(), seen.end(), dir) != seen.end()) continue;
      seen.push_back(dir);
      const fs::path beside = dir / "tokenizer.json";
      std::error_code ec;
      if (!fs::exists(beside, ec)) continue;
      auto tok = data::Tokenizer::load(beside.string());
      const std::string key = split == &train ? "data.train" : "data.val";
      if (!tok) return tok.status().with_context(cfg.where(key) + ": the tokenizer beside " + key + "'s shards");
      if (!ref) {
        ref.emplace(std::move(*tok));
        *found = beside.string();
      } else if (!tok->same_ids(*ref)) {
        if (!cfg.data.tokenizer.empty()) {
          return Status::invalid_argument(cfg.where("data.tokenizer") + ": data.tokenizer " + cfg.data.tokenizer +
                                          " is not the tokenizer the " + "shards were prepared with (" +
                                          beside.string() + " differs), so their ids would be read as other " +
                                          "tokens; leave data.tokenizer out to take theirs");
        }
        return Status::invalid_argument(
            cfg.where(key) + ": the shards of data.train ('" + cfg.data.train + "') and data.val ('" + cfg.data.val +
            "') were prepared with different tokenizers (" + *found + " and " + beside.string() +
            " differ), so the same id would mean different tokens; prepare them with one vocabulary (or name the "
            "one that holds with data.tokenizer)");
      }
    }
  }
  return ref;
}

// The largest token id of the train and val shards (-1 for none), and the shard that holds it. A shard's scan reads
// all of it (GPT-2's FineWeb 10B is 20 GB), so each rank scans every W-th shard and the ranks' results are gathered:
// the job reads its data once rather than once per rank. Every rank must see the same shards (a node with its own
// copy of the data, another file count, is an error on every rank). Collective.
Expected<std::pair<int32_t, std::string>> largest_token(const RunConfig& cfg, Communicator& world,
                                                        const data::DataLoader& train, const data::DataLoader* val) {
  std::vector<const data::TokenShard*> shards;
  for (const data::DataLoader* split : {&train, val}) {
    if (split == nullptr) continue;
    for (const data::TokenShard& shard : split->shards()) shards.push_back(&shard);
  }
  int32_t mine[3] = {-1, -1, static_cast<int32_t>(shards.size())};  // the id, the shard's index, the shard count
  for (size_t k = static_cast<size_t>(world.rank()); k < shards.size(); k += static_cast<size_t>(world.size())) {
    if (const int32_t m = shards[k]->max_token(); m > mine[0]) {
      mine[0] = m;
      mine[1] = static_cast<int32_t>(k);
    }
  }
  std::vector<int32_t> all(3 * static_cast<size_t>(world.size()));
  world.all_gather(mine, all.data(), 3, DType::kI32).wait();
  for (size_t r = 0; r < static_cast<size_t>(world.size()); ++r) {
    if (all[3 * r + 2] != all[2]) {
      return Status::invalid_argument(cfg.where("data.train") + ": rank " + std::to_string(r) + " finds " +
                                      std::to_string(all[3 * r + 2]) + " shard(s) in data.train and data.val, rank 0 " +
                                      std::to_string(all[2]) +
                                      ": every rank must read the same data (the same files on every node)");
    }
  }
  std::pair<int32_t, std::string> out{-1, ""};
  for (size_t r = 0; r < static_cast<size_t>(world.size()); ++r) {
    if (all[3 * r] > out.first) out = {all[3 * r], shards[static_cast<size_t>(all[3 * r + 1])]->path()};
  }
  return out;
}

// Every rank must run the same resolved config (each reads its own file and command line: a node with another copy
// of the YAML, or a --set given to some tasks only, would otherwise train diverging replicas, or fail later in a
// collective of another size). Rank 0's text goes to every rank; a rank whose own differs names the first key.
Status check_same_config(const RunConfig& cfg, Communicator& world) {
  const std::string mine = to_yaml(cfg);
  const std::string theirs = broadcast_string(world, mine);
  Status st;
  if (theirs != mine) {
    std::istringstream a(mine), b(theirs);
    std::string section, la, lb;
    while (std::getline(a, la) && std::getline(b, lb)) {
      if (!la.starts_with(" ")) section = la.substr(0, la.find(':'));
      if (la == lb) continue;
      const size_t colon = la.find(':');
      const std::string key = section + "." + la.substr(2, colon == std::string::npos ? 0 : colon - 2);
      const auto value = [](const std::string& line) {
        const size_t c = line.find(": ");
        return c == std::string::npos ? line : line.substr(c + 2);
      };
      st = Status::invalid_argument(
          "rank " + std::to_string(world.rank()) + "'s config differs from rank 0's at " + key + ": " + value(la) +
          " here, " + value(lb) + " on rank 0 (" + cfg.where(key) +
          "); every rank must run the same config: the same file and --set arguments on every node");
      break;
    }
    if (st.is_ok())
      st = Status::invalid_argument("rank " + std::to_string(world.rank()) + "'s config differs from rank 0's");
  }
  return agree(world, st, "checking that every rank runs the same config");
}

Expected<data::DataLoader> open_split(const RunConfig& cfg, const std::string& key, const std::string& pattern,
                                      int64_t global_batch, data::SamplingMode mode) {
  data::LoaderOptions o;
  o.pattern = pattern;
  o.block_size = cfg.model.block_size;
  o.global_batch = global_batch;
  o.seed = cfg.run.seed;
  o.mode = mode;
  o.split = key;
  auto loader = data::DataLoader::open(o);
  if (!loader) {
    Status st = loader.status().with_context(cfg.where("data." + key) + ": data." + key + " (with model.block_size " +
                                             std::to_string(cfg.model.block_size) + ")");
    if (key == "val" && st.code() == StatusCode::kNotFound) {  // prepare --val-fraction 0 writes no val.bin
      st = Status::from_code(st.code(), st.message() + "; data.val: \"\" trains without a validation split");
    }
    return st;
  }
  return loader;
}

// On a device (`mem`, this rank's), what the plan may take there: the least free memory over the ranks,
// all-gathered so that every rank decides alike (every rank's backend is run.device's, so all or none take part).
std::optional<DeviceBudget> device_budget(Communicator& world, const std::optional<DeviceMemory>& mem,
                                          int64_t reserve) {
  if (!mem) return std::nullopt;
  std::vector<int64_t> free(static_cast<size_t>(world.size()));
  const int64_t mine = mem->free + mem->backend_bytes;
  world.all_gather(&mine, free.data(), 2, DType::kI32).wait();  // an int64 as two int32s
  DeviceBudget budget;
  budget.rank = static_cast<int>(std::min_element(free.begin(), free.end()) - free.begin());
  budget.free = free[static_cast<size_t>(budget.rank)];
  budget.reserve = reserve;
  return budget;
}

// A rank's node for the placement check: a hash of its host name (the same on one node; different across nodes
// but for a 2^-31 collision), or world rank % n under the test hook fake_nodes:<n> (a cyclic placement on n nodes).
int32_t node_id(int world_rank) {
  if (const auto fault = test_fault(); fault && fault->is("fake_nodes", 1) && fault->args[0] > 0) {
    return static_cast<int32_t>(world_rank % fault->args[0]);
  }
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const size_t hash = std::hash<std::string_view>{}(host);
  return static_cast<int32_t>(hash & 0x7fffffff);
}

// Shard groups are consecutive world ranks. Launched node by node (srun's block distribution, mpirun's by-slot
// mapping) each lies on one node, and its all-gathers and reduce-scatters stay on the node's links; a cyclic
// placement spreads the groups over nodes: the same results, but all of that traffic crosses the network, so
// rank 0 says so. Collective over the world.
void warn_if_shard_groups_span_nodes(Communicator& world, int S) {
  const int32_t mine = node_id(world.rank());
  std::vector<int32_t> nodes(static_cast<size_t>(world.size()));
  world.all_gather(&mine, nodes.data(), 1, DType::kI32).wait();
  if (world.rank() != 0) return;
  for (int g = 0; (g + 1) * S <= world.size(); ++g) {
    std::vector<int32_t> group(nodes.begin() + g * S, nodes.begin() + (g + 1) * S);
    std::sort(group.begin(), group.end());
    const auto spread = std::unique(group.begin(), group.end()) - group.begin();
    if (spread > 1) {
      spdlog::warn(
          "parallel.shard_group_size {}: shard group {} (world ranks {}..{}) spans {} nodes, so its all-gathers and "
          "reduce-scatters cross the network (the same results, slowly). A shard group is consecutive ranks: place "
          "ranks node by node (srun --distribution=block, mpirun --map-by slot), or set shard_group_size to the ranks "
          "of one node",
          S, g, g * S, (g + 1) * S - 1, spread);
      return;
    }
  }
}

}  // namespace

Expected<std::unique_ptr<Trainer>> Trainer::create(const RunConfig& cfg, Communicator& world, int ranks_per_node,
                                                   int local_rank, TrainerHooks hooks) {
  GPT_RETURN_IF_ERROR(check_same_config(cfg, world));
  const bool hybrid = cfg.parallel.strategy == "hybrid";
  const bool automatic = cfg.parallel.strategy == "auto";
  Strategy strategy = Strategy::kDdp;  // auto: decided once the model shape is known
  if (!automatic) {
    GPT_ASSIGN_OR_RETURN(strategy, parse_strategy(hybrid ? cfg.parallel.hybrid_inner : cfg.parallel.strategy));
  }
  GPT_ASSIGN_OR_RETURN(const int shard_group_size, run_shard_group_size(cfg, world.size(), ranks_per_node));
  if (cfg.parallel.shard_group_size > 0 && !hybrid && !automatic && world.rank() == 0) {
    spdlog::warn(
        "{}: parallel.shard_group_size {} is not used: it sizes hybrid's shard groups, and "
        "parallel.strategy is {}",
        cfg.where("parallel.shard_group_size"), cfg.parallel.shard_group_size, cfg.parallel.strategy);
  }
  if (hybrid && shard_group_size == world.size() && world.rank() == 0) {  // what it runs as, said once
    spdlog::warn(
        "{}: parallel.strategy hybrid with one shard group of all {} rank(s) runs as plain {} (no replicas across "
        "groups); parallel.shard_group_size (or the ranks per node) sets smaller groups",
        cfg.where("parallel.strategy"), world.size(), cfg.parallel.hybrid_inner);
  }
  if (strategy == Strategy::kSingle && world.size() > 1) {
    return Status::invalid_argument(cfg.where("parallel.strategy") + ": parallel.strategy: single runs on one " +
                                    "process, but this job has " + std::to_string(world.size()) +
                                    " ranks; choose auto, ddp, zero1, zero2, zero3 or hybrid");
  }
  GPT_RETURN_IF_ERROR(check_batch_split(cfg, world.size()));
  GPT_ASSIGN_OR_RETURN(data::SamplingMode mode, data::parse_sampling_mode(cfg.data.sampling));
  GPT_ASSIGN_OR_RETURN(data::DataLoader train, open_split(cfg, "train", cfg.data.train, cfg.global_batch(), mode));
  // An empty data.val: no validation split, so no evaluations (no val loss in the metrics and summary).
  std::optional<data::DataLoader> val;
  if (!cfg.data.val.empty()) {
    GPT_ASSIGN_OR_RETURN(
        val, open_split(cfg, "val", cfg.data.val, cfg.training.micro_batch_size, data::SamplingMode::kRandom));
  } else if (world.rank() == 0) {
    spdlog::info("{}: data.val is empty: this run has no validation split, so no evaluations and no val loss",
                 cfg.where("data.val"));
  }
  std::string tokenizer_path;
  GPT_ASSIGN_OR_RETURN(std::optional<data::Tokenizer> tokenizer,
                       find_tokenizer(cfg, train, val ? &*val : nullptr, &tokenizer_path));
  GPT_ASSIGN_OR_RETURN(ActivationCheckpointing ckpt,
                       ActivationCheckpointing::parse(cfg.training.activation_checkpointing));

  GptShape shape;
  shape.n_layer = cfg.model.n_layer;
  shape.n_head = cfg.model.n_head;
  shape.n_embd = cfg.model.n_embd;
  shape.block_size = cfg.model.block_size;
  shape.dropout = cfg.model.dropout;
  GPT_ASSIGN_OR_RETURN(const auto largest, largest_token(cfg, world, train, val ? &*val : nullptr));
  const auto& [max_token, max_shard] = largest;
  if (tokenizer && max_token >= tokenizer->vocab_size()) {  // before the vocab_size checks, which would blame it
    return Status::invalid_argument(cfg.where(cfg.data.tokenizer.empty() ? "data.train" : "data.tokenizer") +
                                    ": the data's shard " + max_shard + " has token id " + std::to_string(max_token) +
                                    ", outside the tokenizer's " + std::to_string(tokenizer->vocab_size()) +
                                    " symbols (" + tokenizer_path +
                                    "): shards tokenized with another vocabulary, or damaged ones");
  }
  shape.vocab_size = cfg.model.vocab_size;
  if (shape.vocab_size == 0) shape.vocab_size = tokenizer ? tokenizer->vocab_size() : max_token + 1;
  if (max_token >= shape.vocab_size) {
    return Status::invalid_argument(cfg.where("model.vocab_size") + ": model.vocab_size " +
                                    std::to_string(shape.vocab_size) + " is too small: the data's shard " + max_shard +
                                    " has token id " + std::to_string(max_token) + ", so it must be at least " +
                                    std::to_string(max_token + 1));
  }
  if (tokenizer && tokenizer->vocab_size() > shape.vocab_size) {
    return Status::invalid_argument(cfg.where("model.vocab_size") + ": model.vocab_size " +
                                    std::to_string(shape.vocab_size) + " is smaller than the tokenizer's " +
                                    std::to_string(tokenizer->vocab_size()) + " symbols (" + tokenizer_path + ")");
  }
  if (!cfg.model.tied_embeddings) {
    return Status::invalid_argument(cfg.where("model.tied_embeddings") +
                                    ": model.tied_embeddings: false is not supported yet (GPT-2 ties the LM head)");
  }
  // The planner's figures for this run; under `auto` they also choose the strategy, within the device's free
  // memory where there is a device (the backend is made first for that: its CUDA context is in what is not free).
  GPT_ASSIGN_OR_RETURN(PlanInput in, plan_input(cfg, shape, world.size(), ranks_per_node));
  const std::vector<StrategyPlan> plans = plan_all(in);
  Expected<std::unique_ptr<Backend>> backend =
      hooks.backend ? std::move(hooks.backend) : make_backend(cfg.run.device, local_rank, ranks_per_node);
  if (!backend) return backend.status().with_context(cfg.where("run.device"));
  const std::optional<DeviceMemory> device_memory = (*backend)->device_memory();
  const std::optional<DeviceBudget> budget =
      device_budget(world, device_memory, device_memory_reserve_bytes(cfg.parallel));
  if (automatic) {
    auto choice = choose_auto(plans, cfg.parallel.device_memory_gb, budget);
    if (!choice) {
      return choice.status().with_context(cfg.where("parallel.device_memory_gb") + ": parallel.strategy auto");
    }
    strategy = choice->strategy;
    spdlog::info("parallel.strategy auto chose {}: {}", strategy_name(strategy), choice->reason);
  }
  GPT_ASSIGN_OR_RETURN(const StrategyPlan* found, find_run_plan(plans, strategy, shard_group_size, world.size()));
  const StrategyPlan& plan = *found;
  if (budget) {
    const std::string key = automatic ? "parallel.device_memory_gb" : "parallel.strategy";
    GPT_RETURN_IF_ERROR(check_plan_fits(plan, plans, *budget).with_context(cfg.where(key) + ": " + key));
    spdlog::info("device memory: {} plans {} per rank, within {}", plan.name(), format_bytes(plan.total),
                 budget->describe());
  }
  GPT_ASSIGN_OR_RETURN(std::optional<CheckpointReader> resume, open_resume(cfg, shape, world));
  std::optional<CheckpointReader> init_from;
  if (!resume) {
    GPT_ASSIGN_OR_RETURN(init_from, open_init_from(cfg, shape, world));
  } else if (!cfg.checkpoint.init_from.empty()) {
    spdlog::info("checkpoint.init_from {} not read: the run resumes from {}", cfg.checkpoint.init_from, resume->dir());
  }
  if (resume && tokenizer) {
    // The ids the checkpoint learned against must mean the same tokens in this run's data (init_from only warns: a
    // fine-tune may start from weights of another vocabulary on purpose; a resumed run continues the same one).
    Status same;
    const std::string theirs = resume->file_path(resume->manifest().tokenizer);
    if (world.rank() == 0 && !theirs.empty()) {
      auto saved = data::Tokenizer::load(theirs);
      if (!saved) {
        same = saved.status().with_context("checkpoint.resume");
      } else if (!saved->same_ids(*tokenizer)) {
        same = Status::invalid_argument(
            cfg.where("checkpoint.resume") + ": checkpoint.resume: " + theirs +
            " differs from this run's tokenizer (data.tokenizer, or the one beside data.train): the checkpoint's "
            "ids would read this data as other tokens; resume with the data it was trained on");
      }
    }
    GPT_RETURN_IF_ERROR(agree(world, same, "comparing the checkpoint's tokenizer"));
  }
  if (resume && world.rank() == 0) {
    // What may change on a resume but is rarely meant to: said in the log, against the checkpoint's config.yaml.
    const std::string saved_path = resume->file_path(resume->manifest().config);
    std::string text;
    if (!saved_path.empty() && read_file(saved_path, &text).is_ok()) {
      if (Expected<RunConfig> saved = load_run_config_text(text, saved_path, {}); saved) {
        const std::pair<const char*, std::pair<std::string, std::string>> keys[] = {
            {"data.train", {saved->data.train, cfg.data.train}},
            {"data.val", {saved->data.val, cfg.data.val}},
            {"model.dropout", {std::to_string(saved->model.dropout), std::to_string(cfg.model.dropout)}}};
        for (const auto& [key, values] : keys) {
          if (values.first == values.second) continue;
          spdlog::warn("{}: {} is '{}' where the checkpoint's run had '{}' ({}): resuming with it", cfg.where(key), key,
                       values.second, values.first, saved_path);
        }
      }
    }
  }
  if (resume && resume->manifest().sampling != "sequential" && resume->manifest().global_batch != cfg.global_batch() &&
      world.rank() == 0) {  // allowed (random batches are drawn per step), but worth a line in the log
    spdlog::info("{}: the global batch changes from the checkpoint's {} sequences to {}",
                 cfg.where("training.global_batch_sequences"), resume->manifest().global_batch, cfg.global_batch());
  }
  if (resume && resume->manifest().sampling == "sequential" && resume->manifest().global_batch != cfg.global_batch()) {
    return Status::invalid_argument(cfg.where("training.global_batch_sequences") + ": the checkpoint " + resume->dir() +
                                    " was saved with a global batch of " +
                                    std::to_string(resume->manifest().global_batch) +
                                    " sequences and sequential data order, which continues only with the same "
                                    "global batch; this run has " +
                                    std::to_string(cfg.global_batch()));
  }
  std::unique_ptr<Trainer> trainer(new Trainer(cfg, world, strategy, shard_group_size, shape, std::move(train),
                                               std::move(val), std::move(tokenizer), ckpt, plan, std::move(resume),
                                               std::move(*backend), std::move(hooks)));
  if (device_memory) {  // what this rank's device holds now beyond the tracked buffers (another trainer's, in tests)
    trainer->device_untracked_at_start_ =
        device_memory->total - device_memory->free - MemTracker::instance().stats().total_current;
  }
  GPT_RETURN_IF_ERROR(trainer->init_state());
  // Loaded (and every slice read verified) before run() writes anything.
  if (trainer->resume_) GPT_RETURN_IF_ERROR(trainer->restore());
  if (init_from) GPT_RETURN_IF_ERROR(trainer->load_initial_weights(*init_from));
  return trainer;
}

Trainer::Trainer(const RunConfig& config, Communicator& world, Strategy strategy, int shard_group_size, GptShape shape,
                 data::DataLoader train, std::optional<data::DataLoader> val, std::optional<data::Tokenizer> tokenizer,
                 ActivationCheckpointing ckpt, StrategyPlan plan, std::optional<CheckpointReader> resume,
                 std::unique_ptr<Backend> backend, TrainerHooks hooks)
    : config_(config),
      world_(world),
      shape_(shape),
      train_(std::move(train)),
      val_(std::move(val)),
      tokenizer_(std::move(tokenizer)),
      plan_(std::move(plan)),
      resume_(std::move(resume)) {
  save_comm_ = world_.split(0, world_.rank(), "checkpoint");
  backend_ = std::move(backend);
  hooks_ = std::move(hooks);
  backend_->set_threads(config_.run.threads);
  // On a GPU, bf16 parameters also mean bf16 products (GEMMs and attention on the tensor cores, fp32
  // accumulation), as FSDP's param_dtype does; the CPU computes through fp32.
  if (config_.parallel.param_dtype == "bf16" && !backend_->host_memory()) backend_->set_compute_dtype(DType::kBF16);
  const GeluFusion fusion = parse_gelu_fusion(config_.gelu_fusion()).value();  // validated
  const Status fused = backend_->set_gelu_fusion(fusion);
  GPT_CHECK_MSG(fused.is_ok(), fused.message().c_str());  // validation lets through only what the backend takes
  const Status attention =
      backend_->set_attention_kernel(parse_attention_kernel(config_.run.attention_kernel).value());  // validated
  GPT_CHECK_MSG(attention.is_ok(), attention.message().c_str());
  model_ = std::make_unique<Gpt>(shape_, *backend_, ckpt);
  if (shard_group_size != world_.size()) {
    // The process mesh: world rank w is shard w % S of replica w / S.
    const int w = world_.rank(), S = shard_group_size;
    // Named with their color: the watchdog compares collectives of same-named groups across ranks.
    shard_group_ = world_.split(w / S, w % S, "shard." + std::to_string(w / S));
    replicate_group_ = world_.split(w % S, w / S, "replicate." + std::to_string(w % S));
    warn_if_shard_groups_span_nodes(world_, S);
  }
  strategy_ = strategy;
}

Status Trainer::init_state() {
  Communicator* shard_group = shard_group_ ? shard_group_.get() : &world_;
  Communicator* grad_group = shard_group;
  Communicator* replicas = replicate_group_.get();
  if (!backend_->host_memory() && strategy_ != Strategy::kSingle) {
    // Parameters and gradients live on the device: their collectives go through the device's communicator
    // (NCCL), bootstrapped over the same MPI groups, which keep carrying the host-side scalars.
    auto make = [&](Communicator& bootstrap) {
      const std::string name(bootstrap.group_name());
      return hooks_.device_communicator ? hooks_.device_communicator(bootstrap, *backend_, name)
                                        : make_device_communicator(bootstrap, *backend_, name);
    };
    auto dev = make(*shard_group);
    if (!dev) return dev.status().with_context(config_.where("run.device"));
    device_shard_group_ = std::move(*dev);
    grad_group = device_shard_group_.get();
    if (replicas != nullptr) {
      auto rep = make(*replicas);
      if (!rep) return rep.status().with_context(config_.where("run.device"));
      device_replicate_group_ = std::move(*rep);
      replicas = device_replicate_group_.get();
    }
  }
  ShardingOptions options = sharding_options(config_.parallel);
  options.rounding_seed = config_.run.seed;
  params_ = std::make_unique<ShardedParams>(model_->layout(), *backend_, *grad_group, strategy_, replicas, options,
                                            shard_group);
  params_->init(shape_, config_.run.seed);
  const auto& t = config_.training;
  optimizer_ = std::make_unique<AdamW>(*backend_, model_->layout(), params_->regions(), params_->local_numel(),
                                       AdamWConfig{t.beta1, t.beta2, t.eps, t.weight_decay});
  rows_per_rank_ = config_.global_batch() / world_.size();
  schedule_.kind = t.lr_schedule == "constant" ? LrSchedule::Kind::kConstant
                   : t.lr_schedule == "linear" ? LrSchedule::Kind::kLinear
                                               : LrSchedule::Kind::kCosine;
  schedule_.lr = t.lr;
  schedule_.min_lr = t.min_lr;
  schedule_.warmup_steps = t.warmup_steps;
  schedule_.decay_steps = t.decay_steps > 0 ? t.decay_steps : t.steps;
  // One loss slot per micro-batch of a step: a step's losses are read once, after all of them are queued.
  model_->prepare(t.micro_batch_size, shape_.block_size, static_cast<int>(rows_per_rank_ / t.micro_batch_size));
  if (config_.checkpoint.async || !backend_->host_memory()) allocate_save_copy();  // device: saves stage here
  const size_t n = static_cast<size_t>(t.micro_batch_size) * shape_.block_size;
  inputs_.resize(n);
  targets_.resize(n);
  return Status::ok();
}

}  // namespace gpt
