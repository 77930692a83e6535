#include "train/trainer.h"

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
#include "core/stop_signal.h"
#include "core/test_fault.h"
#include "train/metrics.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// The tokenizer named by data.tokenizer, else tokenizer.json beside the first train shard if present. Without
// data.tokenizer, the tokenizer.json files beside the train and val shards must agree: shards `prepare`d with
// different vocabularies would mix ids that mean different tokens.
Expected<std::optional<data::Tokenizer>> find_tokenizer(const RunConfig& cfg, const data::DataLoader& train,
                                                        const data::DataLoader& val) {
  std::string path = cfg.data.tokenizer;
  if (path.empty()) {
    std::optional<data::Tokenizer> first;
    std::string first_path;
    std::vector<fs::path> seen;
    for (const data::DataLoader* split : {&train, &val}) {
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
        if (!first) {
          first = std::move(*tok);
          first_path = beside.string();
        } else if (tok->to_json() != first->to_json()) {
          return Status::invalid_argument(
              cfg.where(key) + ": the shards of data.train ('" + cfg.data.train + "') and data.val ('" + cfg.data.val +
              "') were prepared with different tokenizers (" + first_path + " and " + beside.string() +
              " differ), so the same id would mean different tokens; prepare them with one vocabulary (or name the "
              "one that holds with data.tokenizer)");
        }
      }
    }
    return first;
  }
  auto tok = data::Tokenizer::load(path);
  if (!tok) return tok.status().with_context(cfg.where("data.tokenizer") + ": data.tokenizer");
  return std::optional<data::Tokenizer>(std::move(*tok));
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
    return loader.status().with_context(cfg.where("data." + key) + ": data." + key + " (with model.block_size " +
                                        std::to_string(cfg.model.block_size) + ")");
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

// Whether the run in `out_dir` finished at step `steps`: its final model (manifest.json of out_dir/model, written
// after the last checkpoint) is at that step and its summary.json, written last, is there.
bool run_finished_on_disk(const fs::path& out_dir, int64_t steps) {
  std::error_code ec;
  if (!fs::exists(out_dir / "summary.json", ec)) return false;
  std::ifstream in(out_dir / "model" / "manifest.json", std::ios::binary);
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const Expected<Manifest> m = parse_manifest(text, (out_dir / "model" / "manifest.json").string());
  return m && m->step >= steps;
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
  if (strategy == Strategy::kSingle && world.size() > 1) {
    return Status::invalid_argument(cfg.where("parallel.strategy") + ": parallel.strategy: single runs on one " +
                                    "process, but this job has " + std::to_string(world.size()) +
                                    " ranks; choose auto, ddp, zero1, zero2, zero3 or hybrid");
  }
  GPT_RETURN_IF_ERROR(check_batch_split(cfg, world.size()));
  GPT_ASSIGN_OR_RETURN(data::SamplingMode mode, data::parse_sampling_mode(cfg.data.sampling));
  GPT_ASSIGN_OR_RETURN(data::DataLoader train, open_split(cfg, "train", cfg.data.train, cfg.global_batch(), mode));
  GPT_ASSIGN_OR_RETURN(data::DataLoader val, open_split(cfg, "val", cfg.data.val, cfg.training.micro_batch_size,
                                                        data::SamplingMode::kRandom));
  GPT_ASSIGN_OR_RETURN(std::optional<data::Tokenizer> tokenizer, find_tokenizer(cfg, train, val));
  GPT_ASSIGN_OR_RETURN(ActivationCheckpointing ckpt,
                       ActivationCheckpointing::parse(cfg.training.activation_checkpointing));

  GptShape shape;
  shape.n_layer = cfg.model.n_layer;
  shape.n_head = cfg.model.n_head;
  shape.n_embd = cfg.model.n_embd;
  shape.block_size = cfg.model.block_size;
  shape.dropout = cfg.model.dropout;
  const int32_t max_token = std::max(train.max_token(), val.max_token());
  shape.vocab_size = cfg.model.vocab_size;
  if (shape.vocab_size == 0) shape.vocab_size = tokenizer ? tokenizer->vocab_size() : max_token + 1;
  if (max_token >= shape.vocab_size) {
    return Status::invalid_argument(cfg.where("model.vocab_size") + ": model.vocab_size " +
                                    std::to_string(shape.vocab_size) + " is too small: the data ('" + cfg.data.train +
                                    "', '" + cfg.data.val + "') has token id " + std::to_string(max_token) +
                                    ", so it must be at least " + std::to_string(max_token + 1));
  }
  if (tokenizer && tokenizer->vocab_size() > shape.vocab_size) {
    return Status::invalid_argument(cfg.where("model.vocab_size") + ": model.vocab_size " +
                                    std::to_string(shape.vocab_size) + " is smaller than the tokenizer's " +
                                    std::to_string(tokenizer->vocab_size()) + " symbols");
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
      } else if (saved->to_json() != tokenizer->to_json()) {
        same = Status::invalid_argument(
            cfg.where("checkpoint.resume") + ": checkpoint.resume: " + theirs +
            " differs from this run's tokenizer (data.tokenizer, or the one beside data.train): the checkpoint's "
            "ids would read this data as other tokens; resume with the data it was trained on");
      }
    }
    GPT_RETURN_IF_ERROR(agree(world, same, "comparing the checkpoint's tokenizer"));
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
                 data::DataLoader train, data::DataLoader val, std::optional<data::Tokenizer> tokenizer,
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

Trainer::~Trainer() {
  if (save_thread_.joinable()) save_thread_.join();
}

double Trainer::peak_flops() const {
  return config_.logging.peak_tflops > 0 ? config_.logging.peak_tflops * 1e12 : backend_->peak_flops();
}

double Trainer::flops_per_token() const {
  const double n = static_cast<double>(shape_.num_params()) - static_cast<double>(shape_.block_size) * shape_.n_embd;
  const double L = shape_.n_layer, H = shape_.n_head, Q = shape_.n_embd / shape_.n_head, T = shape_.block_size;
  return 6.0 * n + 12.0 * L * H * Q * T;
}

int Trainer::first_nonfinite_unit() {
  const int n = static_cast<int>(model_->layout().units.size());
  std::vector<float> bad(static_cast<size_t>(n), 0.0f);
  for (const MasterRegion& r : params_->regions()) {
    // A sum of squares is non-finite when an element is (or when one exceeds ~1e19, as bad a gradient).
    if (r.length > 0 && !std::isfinite(backend_->sum_squares(params_->local_grads() + r.local_offset, r.length))) {
      bad[static_cast<size_t>(r.unit)] = 1.0f;
    }
  }
  if (world_.size() > 1) world_.all_reduce(bad.data(), n, DType::kF32).wait();
  for (int u = 0; u < n; ++u) {
    if (bad[static_cast<size_t>(u)] > 0.0f) return u;
  }
  return -1;
}

namespace {

// Test hook nan_grad:<step>:<unit> puts a NaN into that unit's gradient at that step (1-based), on every
// rank that holds part of it, as an overflow in backward would.
void maybe_inject_nan(const std::optional<TestFault>& fault, int64_t step, ShardedParams& params, Backend& be) {
  if (!fault || !fault->is("nan_grad", 2) || fault->args[0] != step) return;
  const float nan = std::nanf("");
  for (const MasterRegion& r : params.regions()) {
    if (r.unit == fault->args[1] && r.length > 0) {
      be.to_device(const_cast<float*>(params.local_grads()) + r.local_offset, &nan, sizeof(float));
    }
  }
}

// Test hook hang:<rank>:<step> makes that rank stop at the start of that step (1-based) without entering a
// collective, as a rank stuck in I/O or a deadlock of its own would.
// stop:<rank>:<step> stops that whole process there (SIGSTOP: its watchdog too), as a rank whose node froze would.
void maybe_hang(const std::optional<TestFault>& fault, int64_t step, int rank) {
  if (fault && fault->is("stop", 2) && fault->args[0] == rank && fault->args[1] == step) ::raise(SIGSTOP);
  if (!fault || !fault->is("hang", 2) || fault->args[0] != rank || fault->args[1] != step) return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

Expected<float> Trainer::train_step(int64_t step) {
  maybe_hang(fault_, step + 1, world_.rank());
  const int B = config_.training.micro_batch_size;
  const int64_t accum = rows_per_rank_ / B;  // micro-batches on this rank
  const float loss_scale = 1.0f / static_cast<float>(config_.global_batch() * shape_.block_size);
  const uint64_t batch = train_.next_batch_index();
  const int64_t first_row = world_.rank() * rows_per_rank_;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const int64_t row = first_row + micro * B;
    train_.fill_rows(batch, row, B, inputs_.data(), targets_.data());
    params_->begin_micro_batch(micro == 0, micro + 1 == accum);
    const StepContext ctx{config_.run.seed, step, row, true};
    model_->forward_backward_into(*params_, inputs_.data(), targets_.data(), loss_scale, ctx, static_cast<int>(micro));
  }
  // The gradients first: finish_grads launches the last bucket's collective at once, and the norm waits for all
  // of them; the losses are read after that, from an idle GPU, so that a step waits for the device once, not
  // also before the last collective has started.
  params_->finish_grads();
  maybe_inject_nan(fault_, step + 1, *params_, *backend_);
  last_grad_norm_ = std::sqrt(params_->grad_sq_norm());
  float loss_sum = 0.0f;  // in micro-batch order
  for (const float micro_loss : model_->mean_losses(static_cast<int>(accum))) loss_sum += micro_loss;
  // The step's loss: the mean over every micro-batch of every rank. With it, whether any rank has been asked
  // to stop (SIGUSR1/SIGTERM/SIGINT), so that all stop after this step.
  float sums[2] = {loss_sum, stop_signal() != 0 ? 1.0f : 0.0f};
  if (world_.size() > 1) world_.all_reduce(sums, 2, DType::kF32).wait();
  stop_requested_ = sums[1] > 0.0f;
  const float loss = sums[0] / static_cast<float>(config_.grad_accum_steps());
  step_skipped_ = false;
  if (!std::isfinite(loss) || !std::isfinite(last_grad_norm_)) {
    const int unit = first_nonfinite_unit();
    const std::string what = fmt::format(
        "step {}: loss {}, gradient norm {}; {}", step + 1, loss, last_grad_norm_,
        unit >= 0 ? "the first unit with a non-finite gradient is '" + model_->layout().units[unit].name + "'"
                  : std::string("no gradient element is non-finite (the norm overflowed)"));
    if (config_.training.nonfinite == "stop") {
      return Status::failed_precondition(what + " (training.nonfinite: stop; lower training.lr, clip harder with " +
                                         "training.grad_clip, or set training.nonfinite: skip_step)");
    }
    if (world_.rank() == 0) spdlog::warn("{}: update skipped (training.nonfinite: skip_step)", what);  // all alike
    step_skipped_ = true;
    return loss;
  }
  const float scale = clip_scale(last_grad_norm_, config_.training.grad_clip);
  // The bf16 parameters are written by the optimizer's pass itself, rounded as publish would at this step.
  optimizer_->step(params_->master(), params_->local_grads(), schedule_.at(step), scale, params_->master_lo(),
                   params_->rounding(optimizer_->steps_taken() + 1));
  params_->publish(optimizer_->steps_taken(), /*lo_written=*/true);
  return loss;
}

void Trainer::log_planned_vs_measured(TrainSummary& summary) const {
  const MemStats m = MemTracker::instance().stats();
  const std::pair<MemCategory, int64_t> rows[] = {
      {MemCategory::kParams, plan_.params},           {MemCategory::kGrads, plan_.grads},
      {MemCategory::kMaster, plan_.master},           {MemCategory::kOptimizer, plan_.optimizer},
      {MemCategory::kActivations, plan_.activations}, {MemCategory::kWorkspace, plan_.workspace},
      {MemCategory::kComm, plan_.comm_buffers}};
  std::string table;
  for (const auto& [category, planned] : rows) {
    const auto c = static_cast<size_t>(category);
    summary.planned_bytes[c] = planned;
    summary.measured_bytes[c] = m.peak[c];
    table += fmt::format("\n  {:<12} planned {:>12}  measured {:>12}", mem_category_name(category),
                         format_bytes(planned), format_bytes(m.peak[c]));
  }
  if (world_.rank() == 0) spdlog::info("memory per rank after step 1 ({}):{}", plan_.name(), table);
}

void Trainer::log_device_memory(TrainSummary& summary) const {
  summary.device_in_use_bytes = backend_->device_memory_in_use();
  if (!summary.device_in_use_bytes) return;
  const MemStats m = MemTracker::instance().stats();
  summary.device_tracked_bytes = m.total_current;
  summary.device_tracked_buffers = m.live_buffers;
  summary.device_untracked_at_start = device_untracked_at_start_;
  if (world_.rank() != 0) return;
  const int64_t untracked = *summary.device_in_use_bytes - summary.device_tracked_bytes;
  const int64_t since_start = untracked - device_untracked_at_start_;
  const int64_t reserve = device_memory_reserve_bytes(config_.parallel);
  spdlog::info(
      "device memory after step 1: {} in use (the driver's total - free), {} of it gpt-train's buffers; the other {}: "
      "the CUDA context, cuBLAS(Lt), NCCL's own buffers and allocation rounding, which the plan does not count; {} "
      "of that was there at the start, {} came since (parallel.device_memory_reserve_gb keeps {} for it)",
      format_bytes(*summary.device_in_use_bytes), format_bytes(summary.device_tracked_bytes), format_bytes(untracked),
      format_bytes(device_untracked_at_start_), format_bytes(since_start), format_bytes(reserve));
  if (since_start > reserve) {
    spdlog::warn(
        "device memory: {} was allocated outside the plan after the start, more than parallel.device_memory_reserve_gb "
        "({}); a plan that fills the GPU may run out of memory: raise it to at least {:.2f}",
        format_bytes(since_start), format_bytes(reserve), static_cast<double>(since_start) / 1e9);
  }
}

std::string Trainer::strategy_label() const {
  const std::string inner(strategy_name(params_->strategy()));
  return replicate_group_ ? "hybrid:" + inner : inner;
}

Status Trainer::write_summary(const TrainSummary& summary, int64_t steps_done, const std::string& model_dir) {
  if (world_.rank() != 0) return Status::ok();
  RunSummary s;
  s.steps_done = steps_done;
  s.total_steps = config_.training.steps;
  s.steps_this_run = summary.steps;
  s.interrupted = summary.interrupted;
  s.final_loss = summary.final_loss;
  s.final_val_loss = summary.final_val_loss;
  s.seconds = summary.seconds;
  s.tokens_per_s = summary.tokens_per_s;
  s.gflops = flops_per_token() * summary.tokens_per_s / 1e9;
  if (peak_flops() > 0) s.mfu = s.gflops * 1e9 / (peak_flops() * world_.size());
  s.strategy = strategy_label();
  s.world_size = world_.size();
  s.memory = MemTracker::instance().stats();
  if (summary.steps > 0) s.mem_planned = summary.planned_bytes;
  s.device_in_use_bytes = summary.device_in_use_bytes;
  s.device_tracked_bytes = summary.device_tracked_bytes;
  s.device_untracked_at_start = summary.device_untracked_at_start;
  s.comm = comm_stats();
  s.model_dir = model_dir;
  s.latest_checkpoint = latest_checkpoint(checkpoint_root());
  return write_run_summary((std::filesystem::path(config_.run.out_dir) / "summary.json").string(), s);
}

CommStats Trainer::comm_stats() const {
  CommStats total = world_.stats();
  for (const auto* group :
       {shard_group_.get(), replicate_group_.get(), device_shard_group_.get(), device_replicate_group_.get()}) {
    if (group == nullptr) continue;
    const CommStats s = group->stats();
    for (size_t i = 0; i < kNumCommOps; ++i) {
      total.ops[i].calls += s.ops[i].calls;
      total.ops[i].elements += s.ops[i].elements;
      total.ops[i].bytes += s.ops[i].bytes;
      total.ops[i].seconds += s.ops[i].seconds;
    }
    total.last_seq += s.last_seq;
  }
  return total;
}

float Trainer::evaluate() {
  // The eval_batches micro-batches are dealt out over the ranks, batch k to rank k % W in round k / W, so an
  // evaluation costs each rank ceil(E / W) forwards instead of E. Every rank runs the same number of forwards
  // (the sharded strategies gather parameters inside the forward): a rank past the last batch in the final
  // round recomputes batch 0 and drops it. The per-batch losses are then gathered and summed in batch order,
  // exactly the single-process sum, so the mean is the same to the bit as one rank computing every batch.
  const int B = config_.training.micro_batch_size;
  const int E = config_.training.eval_batches;
  const int W = world_.size(), r = world_.rank();
  const int rounds = (E + W - 1) / W;
  std::vector<float> mine(static_cast<size_t>(rounds)), all(static_cast<size_t>(rounds) * W);
  for (int i = 0; i < rounds; ++i) {
    const int k = i * W + r;
    val_.fill_rows(static_cast<uint64_t>(k < E ? k : 0), 0, B, inputs_.data(), targets_.data());
    mine[i] =
        model_->forward_loss(*params_, inputs_.data(), targets_.data(), StepContext{config_.run.seed, 0, 0, false});
  }
  world_.all_gather(mine.data(), all.data(), rounds, DType::kF32).wait();
  double sum = 0.0;
  for (int k = 0; k < E; ++k) sum += all[static_cast<size_t>(k % W) * rounds + k / W];
  return static_cast<float>(sum / E);
}

Expected<TrainSummary> Trainer::run() {
  auto summary = run_steps();
  // Taken at the last step before its evaluation; a run stopped early (a signal, an error) reports what it ran, and
  // one that had nothing to train (resumed at its end) nothing.
  if (profile_report_.empty() && !(summary && summary->steps == 0)) profile_report_ = backend_->profile_report();
  if (!profile_report_.empty() && world_.rank() == 0) spdlog::info("{}", profile_report_);
  // A save still being written in the background finishes (or fails) before the error ends the job, so the
  // newest checkpoint is not lost to an abort.
  if (!summary) (void)wait_for_save();
  return summary;
}

bool Trainer::run_finished(const fs::path& out_dir, int64_t steps) {
  int32_t finished = world_.rank() == 0 && run_finished_on_disk(out_dir, steps) ? 1 : 0;
  world_.broadcast(&finished, 1, DType::kI32, 0).wait();
  return finished != 0;
}

Expected<TrainSummary> Trainer::run_steps() {
  const auto& t = config_.training;
  const bool writer = world_.rank() == 0;
  const fs::path out_dir(config_.run.out_dir);
  if (start_step_ >= t.steps && start_step_ > 0 && run_finished(out_dir, t.steps)) {
    // Resumed at the end of a run that finished (submitted again, as a requeued job can be): its summary, metrics
    // and final model stay as the run left them. A run stopped between its last checkpoint and its final model
    // (killed while saving) goes on below: no step to take, but the model and summary are written.
    spdlog::info(
        "the run is complete: resumed at step {} of training.steps {}, nothing to train; {} is left as it "
        "is (raise training.steps to train on)",
        start_step_, t.steps, out_dir.string());
    return TrainSummary{};
  }
  std::optional<MetricsWriter> metrics;
  if (writer) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (ec) {
      return Status::io_error(config_.where("run.out_dir") + ": cannot create run.out_dir '" + out_dir.string() +
                              "': " + ec.message());
    }
    std::ofstream f(out_dir / "config.yaml");
    f << to_yaml(config_);
    if (!f) return Status::io_error("cannot write '" + (out_dir / "config.yaml").string() + "'");
    GPT_ASSIGN_OR_RETURN(MetricsWriter m,
                         MetricsWriter::open((out_dir / config_.logging.metrics_file).string(), start_step_));
    metrics.emplace(std::move(m));
  }
  spdlog::info("model: {} layers, {} heads, {} wide, block {}, vocab {}: {:.2f}M parameters", shape_.n_layer,
               shape_.n_head, shape_.n_embd, shape_.block_size, shape_.vocab_size, shape_.num_params() / 1e6);
  spdlog::info(
      "batch: {} sequences x {} tokens per step over {} rank(s), {} micro-batches of {} per rank; {} steps; "
      "strategy {}; activation checkpointing {}",
      config_.global_batch(), shape_.block_size, world_.size(), rows_per_rank_ / t.micro_batch_size, t.micro_batch_size,
      t.steps,
      replicate_group_ ? fmt::format("hybrid ({} replicas x {}-rank {} shard groups)", replicate_group_->size(),
                                     shard_group_->size(), strategy_name(params_->strategy()))
                       : std::string(strategy_name(params_->strategy())),
      t.activation_checkpointing);

  TrainSummary summary;
  const double tokens_per_step = static_cast<double>(config_.global_batch()) * shape_.block_size;
  const auto start = std::chrono::steady_clock::now();
  Progress progress(start_step_, t.steps, config_.logging.log_interval, tokens_per_step, flops_per_token(), writer,
                    peak_flops() * world_.size());
  int64_t allocations_at_first_step = MemTracker::instance().stats().allocations;  // reset after step 1
  auto count_late_allocations = [&] {
    summary.allocations_after_first_step = MemTracker::instance().stats().allocations - allocations_at_first_step;
    if (summary.allocations_after_first_step > 0) {
      spdlog::warn("{} tracked allocations after the first step (the pools should have been sized up front)",
                   summary.allocations_after_first_step);
    }
  };
  for (int64_t step = start_step_; step < t.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    GPT_ASSIGN_OR_RETURN(const float loss, train_step(step));
    if (step == start_step_) allocations_at_first_step = MemTracker::instance().stats().allocations;
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    summary.final_loss = loss;
    summary.losses.push_back(loss);
    if (step == start_step_) {
      progress.clear_live();
      log_planned_vs_measured(summary);
      log_device_memory(summary);
      // The profile (GPT_TRAIN_CUDA_PROFILE=1) times the steps after the first: that one also runs cuBLASLt's
      // heuristics and loads the kernels. A run of one step, or one stopping after it (a signal), keeps it.
      if (step + 1 < t.steps && !stop_requested_) backend_->profile_restart();
    }
    StepMetrics m;
    m.step = step + 1;
    m.loss = loss;
    m.lr = schedule_.at(step);
    m.grad_norm = last_grad_norm_;
    m.skipped = step_skipped_;
    m.step_ms = step_s * 1e3;
    m.tokens_per_s = tokens_per_step / step_s;
    m.gflops = flops_per_token() * m.tokens_per_s / 1e9;
    const bool last = step + 1 == t.steps;
    if (last) profile_report_ = backend_->profile_report();  // the training steps' ops, before the final eval
    if ((t.eval_interval > 0 && (step + 1) % t.eval_interval == 0) || last) {
      m.val_loss = evaluate();
      summary.final_val_loss = m.val_loss;
    }
    m.memory = MemTracker::instance().stats();
    m.comm = comm_stats();
    if (metrics) GPT_RETURN_IF_ERROR(metrics->write(m));
    progress.update(m);
    const bool saved = config_.checkpoint.every > 0 && ((step + 1) % config_.checkpoint.every == 0 || last);
    if (saved) {
      progress.clear_live();
      GPT_RETURN_IF_ERROR(save(step + 1, /*model_only=*/false));
    }
    if (stop_requested_ && !last) {
      progress.clear_live();
      if (!saved) GPT_RETURN_IF_ERROR(save(step + 1, /*model_only=*/false));
      GPT_RETURN_IF_ERROR(wait_for_save());
      const int sig = stop_signal();
      spdlog::info("{}: checkpoint saved after signal at step {}/{} in {}; exiting, --resume auto continues from it",
                   sig != 0 ? std::string(stop_signal_name(sig)) + " received" : "another rank was signalled", step + 1,
                   t.steps, checkpoint_root());
      summary.interrupted = true;
      count_late_allocations();
      summary.steps = step + 1 - start_step_;
      summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      summary.tokens_per_s = tokens_per_step * static_cast<double>(summary.steps) / summary.seconds;
      GPT_RETURN_IF_ERROR(write_summary(summary, step + 1, ""));
      return summary;
    }
  }
  summary.steps = t.steps - start_step_;
  count_late_allocations();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.tokens_per_s = tokens_per_step * static_cast<double>(summary.steps) / summary.seconds;
  const std::string model_dir = (out_dir / "model").string();
  GPT_RETURN_IF_ERROR(wait_for_save());
  GPT_RETURN_IF_ERROR(save(t.steps, /*model_only=*/true));
  GPT_RETURN_IF_ERROR(write_summary(summary, t.steps, model_dir));
  spdlog::info("done: {} steps in {}, final loss {:.4f}{}; weights saved to {}", t.steps,
               format_duration(summary.seconds), summary.final_loss,
               summary.final_val_loss ? fmt::format(", val loss {:.4f}", *summary.final_val_loss) : "", model_dir);
  return summary;
}

}  // namespace gpt
