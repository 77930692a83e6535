#include "config/schema.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <vector>

namespace gpt {
namespace {

Allowed at_least(double v) {
  Allowed a;
  a.min = v;
  return a;
}
Allowed above(double v) {
  Allowed a = at_least(v);
  a.min_exclusive = true;
  return a;
}
Allowed between(double lo, double hi, bool hi_exclusive) {
  Allowed a = at_least(lo);
  a.max = hi;
  a.max_exclusive = hi_exclusive;
  return a;
}
Allowed fraction() { return between(0, 1, /*hi_exclusive=*/true); }  // [0, 1)
Allowed one_of(std::string_view choices) {
  Allowed a;
  a.choices = choices;
  return a;
}
Allowed non_empty() {
  Allowed a;
  a.non_empty = true;
  return a;
}
Allowed anything() { return {}; }
Allowed checked(std::string (*check)(const std::string&), std::string_view text) {
  Allowed a;
  a.check = check;
  a.check_text = text;
  return a;
}

std::string check_checkpointing(const std::string& v) {
  if (v == "none" || v == "full" || v == "selective") return "";
  if (v.starts_with("every:")) {
    int64_t n = 0;
    const char* first = v.data() + 6;
    const char* last = v.data() + v.size();
    auto [ptr, ec] = std::from_chars(first, last, n);
    if (ec == std::errc() && ptr == last && first != last && n >= 1) return "";
  }
  return "expected one of none|full|selective|every:N with N >= 1, got '" + v + "'";
}
Allowed checkpointing() { return checked(check_checkpointing, "none|full|selective|every:N (N >= 1)"); }
std::string check_tied(const std::string& v) {
  return v == "true" ? "" : "false is not supported yet (the LM head always shares the token embedding)";
}
Allowed tied() { return checked(check_tied, "only true for now"); }
// A file the run writes into run.out_dir beside its own: a plain name, not one of theirs.
std::string check_out_file(const std::string& v) {
  if (v.empty() || v == "." || v == ".." || v.find('/') != std::string::npos) {
    return "expected a plain file name (it goes inside run.out_dir), got '" + v + "'";
  }
  for (const char* taken : {"config.yaml", "summary.json", "model", "checkpoints"}) {
    if (v == taken) return "'" + v + "' is a name the run writes itself in run.out_dir; choose another";
  }
  return "";
}
Allowed out_file() {
  return checked(check_out_file, "a plain file name, not config.yaml, summary.json, model or checkpoints");
}

// Key name, section, field name and field accessor from one mention of the field, so they cannot drift.
#define GPT_KEY(sec, fld) #sec "." #fld, #sec, #fld, [](RunConfig & c) -> FieldRef { return &c.sec.fld; }

constexpr std::array<std::string_view, 8> kSections = {"run",      "model",      "data", "training",
                                                       "parallel", "checkpoint", "comm", "logging"};
constexpr std::array<std::string_view, 8> kSectionMeanings = {
    "the run's name, output directory, seed and threads",
    "the GPT-2 shape",
    "token shards and how they are read",
    "steps, batch sizes, AdamW, learning-rate schedule, eval and memory",
    "how ranks under mpirun/srun share the work",
    "sharded checkpoints: cadence, retention, where, resuming, and the weights a fine-tuning run starts from",
    "the collective watchdog",
    "log level and metrics"};

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The candidate nearest to `word`, if it is close enough to be a plausible typo.
std::string closest(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string_view best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (std::string_view c : candidates) {
    // A truncated name ("train", "micro_batch") counts as one edit away.
    const size_t d = word.size() >= 3 && c.starts_with(word) ? 1 : edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, word.size() / 2);
  return best_d <= limit ? std::string(best) : std::string();
}

}  // namespace

std::span<const KeySpec> config_schema() {
  // Built on first use, so a static initialiser elsewhere can read it safely.
  static const KeySpec kSchema[] = {
      {GPT_KEY(run, name), non_empty(), "run name, used in logs and metrics"},
      {GPT_KEY(run, out_dir), non_empty(), "directory for the resolved config, metrics, checkpoints and weights"},
      {GPT_KEY(run, seed), anything(), "seeds parameter init, dropout and data order"},
      {GPT_KEY(run, threads), between(0, kMaxThreads, /*hi_exclusive=*/false),
       "CPU threads for kernels; 0 = all cores"},
      {GPT_KEY(run, device), one_of("cpu|cuda"),
       "where the model computes: cpu, or cuda (one GPU per rank, chosen by the rank's index on its node)"},
      {GPT_KEY(run, gelu_fusion), one_of("auto|none|forward|full"),
       "cuda with parallel.param_dtype bf16: the MLP's GELU computed in cuBLASLt's GEMM epilogues instead of its own "
       "kernels: forward (the fc GEMM writes the GELU's input and output), full (also its backward, in the "
       "projection GEMM's input gradient); within a bf16 rounding of none, not bit for bit; auto: full on cuda with "
       "bf16 parameters, else none"},
      {GPT_KEY(run, attention_kernel), one_of("auto|wmma"),
       "cuda with parallel.param_dtype bf16: auto takes the mma.sync flash-attention kernels (head size 32, 64 or "
       "128), wmma the older WMMA kernels (for comparing them); the same math, within a bf16 rounding"},

      {GPT_KEY(model, n_layer), at_least(1), "transformer blocks"},
      {GPT_KEY(model, n_head), at_least(1), "attention heads per block; must divide n_embd"},
      {GPT_KEY(model, n_embd), at_least(1), "embedding width C"},
      {GPT_KEY(model, block_size), at_least(1), "context length T in tokens"},
      {GPT_KEY(model, vocab_size), between(0, 65536, /*hi_exclusive=*/false),
       "vocabulary size (tokens are uint16); 0 = take it from the data's tokenizer"},
      {GPT_KEY(model, dropout), fraction(), "attention-probability and residual dropout rate"},
      {GPT_KEY(model, tied_embeddings), tied(), "LM head shares the token embedding matrix (GPT-2)"},

      {GPT_KEY(data, train), non_empty(), "training token shard file or glob (llm.c layout)"},
      {GPT_KEY(data, val), anything(),
       "validation token shard file or glob; empty = no validation split (no evaluations, no val loss)"},
      {GPT_KEY(data, tokenizer), anything(),
       "tokenizer.json written by `prepare`, or GPT-2's BPE files as Hugging Face publishes them (tokenizer.json, or "
       "a directory with vocab.json and merges.txt); \"\" = tokenizer.json next to the train shard if present"},
      {GPT_KEY(data, sampling), one_of("random|sequential"), "how training windows are drawn from the shards"},

      {GPT_KEY(training, steps), at_least(1), "optimizer steps to run"},
      {GPT_KEY(training, micro_batch_size), at_least(1), "sequences per forward/backward"},
      {GPT_KEY(training, global_batch_sequences), at_least(0),
       "sequences per optimizer step; a multiple of micro_batch_size; 0 = micro_batch_size"},
      {GPT_KEY(training, global_batch_tokens), at_least(0),
       "tokens per optimizer step, instead of global_batch_sequences; a multiple of block_size * micro_batch_size"},
      {GPT_KEY(training, lr), above(0), "peak learning rate"},
      {GPT_KEY(training, min_lr), at_least(0), "learning rate at the end of decay; <= lr"},
      {GPT_KEY(training, warmup_steps), at_least(0), "linear warmup steps from lr/(warmup+1) to lr"},
      {GPT_KEY(training, lr_schedule), one_of("cosine|linear|constant"), "decay from lr to min_lr after warmup"},
      {GPT_KEY(training, decay_steps), at_least(0),
       "steps over which lr decays to min_lr, counted from 0 as nanoGPT's get_lr does (so metrics step "
       "decay_steps + 1 is the first at min_lr); 0 = training.steps"},
      {GPT_KEY(training, beta1), fraction(), "AdamW first-moment decay"},
      {GPT_KEY(training, beta2), fraction(), "AdamW second-moment decay"},
      {GPT_KEY(training, eps), above(0), "AdamW epsilon"},
      {GPT_KEY(training, weight_decay), at_least(0), "AdamW decoupled weight decay, on 2-D weights only"},
      {GPT_KEY(training, grad_clip), at_least(0), "clip the global gradient norm to this; 0 = off"},
      {GPT_KEY(training, eval_interval), at_least(0), "steps between validation evals; 0 = only at the end"},
      {GPT_KEY(training, eval_batches), at_least(1), "micro-batches per validation eval (shared out over the ranks)"},
      {GPT_KEY(training, activation_checkpointing), checkpointing(),
       "recompute activations in backward: none, full (every block), every:N (blocks 0, N, 2N, ...), selective "
       "(LayerNorm and GELU outputs). A scratch holds one block's recomputed activations, so every:N saves memory "
       "only where it recomputes two blocks or more, and selective only past a few layers; gpt-train plan shows "
       "the bytes"},
      {GPT_KEY(training, nonfinite), one_of("stop|skip_step"),
       "a non-finite loss or gradient norm: stop the run naming the step and the first unit with a non-finite "
       "gradient, or skip that step's update (logged) and go on"},

      {GPT_KEY(parallel, strategy), one_of("single|ddp|zero1|zero2|zero3|hybrid|auto"),
       "single: one process; ddp: replicate, all-reduce grads; zero1/zero2/zero3: shard optimizer state, + grads, "
       "+ params (FSDP full shard); hybrid: shard within groups, replicate across them (HSDP); auto: the "
       "least-communication strategy the planner finds fits parallel.device_memory_gb and, on cuda, the GPU's "
       "free memory less parallel.device_memory_reserve_gb (single on one process; the default)"},
      {GPT_KEY(parallel, device_memory_gb), at_least(0),
       "auto: memory per rank for gpt-train's buffers, in GB (1e9 bytes); 0 = no limit but, on cuda, the GPU's "
       "free memory at the start less parallel.device_memory_reserve_gb (which also bounds a value given here)"},
      {GPT_KEY(parallel, device_memory_reserve_gb), at_least(0),
       "cuda: GB (1e9 bytes) of the GPU's free memory at the start kept for what is allocated later outside the "
       "plan (NCCL's buffers, cudaMalloc's rounding; a run logs it after step 1 as untracked); a plan that does "
       "not fit in the rest stops the run before its buffers are allocated"},
      {GPT_KEY(parallel, shard_group_size), at_least(0),
       "hybrid: ranks per shard group (world = replicas x this); 0 = ranks per node"},
      {GPT_KEY(parallel, hybrid_inner), one_of("zero2|zero3"), "hybrid: the sharding inside each shard group"},
      {GPT_KEY(parallel, prefetch), between(0, 2, /*hi_exclusive=*/false),
       "zero3: units all-gathered ahead of use, overlapping communication with compute"},
      {GPT_KEY(parallel, param_dtype), one_of("fp32|bf16"),
       "parameters as stored and communicated (master weights and optimizer state stay fp32); on cuda also the "
       "inputs of the GEMMs and attention's products (tensor cores, fp32 accumulation and outputs)"},
      {GPT_KEY(parallel, reduce_dtype), one_of("fp32|bf16"), "gradients as communicated (accumulated in fp32)"},
      {GPT_KEY(parallel, stochastic_rounding), anything(),
       "param_dtype bf16: round the bf16 parameters from the fp32 master weights stochastically (unbiased; the "
       "random bits depend only on run.seed, the step and each weight's index, so runs and resumes repeat) "
       "instead of to nearest"},
      {GPT_KEY(parallel, reshard_after_forward), anything(),
       "zero3: free each unit after its forward and gather it again for backward (false: keep it, more memory)"},
      {GPT_KEY(parallel, bucket_mb), at_least(0),
       "ddp: gradient bytes (as communicated, MiB) per all-reduce bucket; consecutive units are grouped until a "
       "bucket reaches this and it is launched while backward goes on, as PyTorch DDP's bucket_cap_mb; 0 = one "
       "all-reduce per unit"},

      {GPT_KEY(checkpoint, every), at_least(0),
       "save a checkpoint every this many steps and after the last step; 0 = no checkpoints"},
      {GPT_KEY(checkpoint, keep_last), at_least(0), "step directories kept (the oldest removed first); 0 = all"},
      {GPT_KEY(checkpoint, dir), anything(), "where step directories go; empty = <run.out_dir>/checkpoints"},
      {GPT_KEY(checkpoint, async), anything(),
       "copy this rank's slices to host memory and write them in a background thread while training goes on "
       "(still atomic; the next save waits for the previous one)"},
      {GPT_KEY(checkpoint, resume), anything(),
       "empty: start fresh; auto: continue from <checkpoint.dir>/latest when there is one; or a step directory "
       "(any world size and strategy), or a checkpoint root (its latest). A run that does not continue its own "
       "checkpoint root's steps refuses a root that already holds some (its saves would replace them). The "
       "command line's --resume sets it"},
      {GPT_KEY(checkpoint, init_from), anything(),
       "fine-tuning: start from these weights instead of a random init (a model directory such as <out_dir>/model "
       "or `checkpoint import`'s, a checkpoint step directory, a checkpoint root: its latest, or a run's out_dir: "
       "its model; any world size and strategy), at step 0 with a fresh optimizer and data order, as torchtitan's "
       "initial_load_path; the model shape must match but for a smaller block_size (wpe cropped, as nanoGPT's "
       "crop_block_size). A checkpoint that checkpoint.resume finds wins over it, so a requeued fine-tuning run "
       "continues"},

      {GPT_KEY(comm, timeout_s), at_least(0),
       "seconds one collective may run before every rank logs its last 20 collectives and the job ends, naming "
       "the first collective where ranks disagree (a rank that skipped one or died); 0 = no watchdog"},
      {GPT_KEY(comm, save_timeout_s), at_least(0),
       "the same for the collectives of a checkpoint save, which wait for the file system (a rank that writes "
       "little waits for the others' writes); 0 = never, under a watchdog that comm.timeout_s runs"},

      {GPT_KEY(logging, level), one_of("trace|debug|info|warn|error"), "log level"},
      {GPT_KEY(logging, log_interval), at_least(1),
       "steps between rank 0's progress lines (on stderr; on a terminal a status line is redrawn between them)"},
      {GPT_KEY(logging, metrics_file), out_file(), "metrics JSONL file name, inside run.out_dir"},
      {GPT_KEY(logging, peak_tflops), at_least(0),
       "dense bf16 peak TFLOP/s of one GPU, the denominator of MFU in progress lines and summary.json; 0 = known "
       "from the GPU's name (H100/H200 989, A100 312), else no MFU"},
  };
  return kSchema;
}
#undef GPT_KEY

std::span<const std::string_view> config_sections() { return kSections; }

std::string_view section_meaning(std::string_view section) {
  for (size_t i = 0; i < kSections.size(); ++i) {
    if (kSections[i] == section) return kSectionMeanings[i];
  }
  return {};
}

const KeySpec* find_config_key(std::string_view key) {
  for (const KeySpec& s : config_schema()) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

std::string_view type_name(const KeySpec& spec) {
  RunConfig probe;
  static constexpr std::string_view kNames[] = {"int", "int64", "uint64", "float", "bool", "string"};
  return kNames[spec.field(probe).index()];
}

std::string suggest_config_key(std::string_view unknown_key) {
  const size_t dot = unknown_key.find('.');
  const std::string_view section = dot == std::string_view::npos ? std::string_view() : unknown_key.substr(0, dot);
  const std::string_view name = dot == std::string_view::npos ? unknown_key : unknown_key.substr(dot + 1);
  // The right name in the wrong section (or with no section) is the likeliest mistake.
  for (const KeySpec& s : config_schema()) {
    if (s.name == name && s.section != section) return std::string(s.key);
  }
  std::vector<std::string_view> names;
  for (const KeySpec& s : config_schema()) {
    if (s.section == section) names.push_back(s.name);
  }
  const std::string best = closest(name, names);
  return best.empty() ? best : std::string(section) + "." + best;
}

std::string suggest_config_section(std::string_view unknown_section) {
  return closest(unknown_section, std::vector<std::string_view>(kSections.begin(), kSections.end()));
}

std::string config_reference_text() {
  const RunConfig defaults;
  std::string out =
      "Run configuration keys. A config file is YAML with one map per section; any key can be overridden\n"
      "with --set section.key=value (the value is read as a YAML scalar).\n";
  for (size_t i = 0; i < kSections.size(); ++i) {
    out += '\n';
    out += kSections[i];
    out += ":  # ";
    out += kSectionMeanings[i];
    out += '\n';
    for (const KeySpec& s : config_schema()) {
      if (s.section != kSections[i]) continue;
      std::string def = format_value(s, defaults);
      if (type_name(s) == "string") def = '"' + def + '"';
      out += "  " + std::string(s.name) + " = " + def + "  (" + std::string(type_name(s));
      const std::string allowed = allowed_text(s);
      if (!allowed.empty()) out += ", " + allowed;
      out += ")\n      " + std::string(s.meaning) + "\n";
    }
  }
  return out;
}

}  // namespace gpt
