// RunConfig: the validated, plain-struct form of a run's YAML (after --set overrides). Every field is
// documented in the schema table (config/schema.cc), which is also what `gpt-train train --help-config`
// prints; defaults here and there must agree (a test checks). Nothing but config/ reads YAML.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace gpt {

// The most CPU threads run.threads (and sample's --threads) take: far more than any machine's cores, and far below
// the counts at which OpenMP's runtime fails to make its pool (65536 crashed libgomp).
inline constexpr int kMaxThreads = 4096;

struct RunSection {
  std::string name = "gpt";               // run name, used in logs and metrics
  std::string out_dir = "runs/gpt";       // where the resolved config, metrics and final weights go
  uint64_t seed = 1337;                   // seeds init, dropout and data order
  int threads = 0;                        // CPU threads for kernels; 0 = all cores
  std::string device = "cpu";             // cpu, or cuda (one GPU per rank, chosen by the rank's index on its node)
  std::string gelu_fusion = "auto";       // auto | none | forward | full: the MLP's GELU in the GEMM epilogues
  std::string attention_kernel = "auto";  // auto | wmma: the tensor-core attention kernels (cuda, bf16)
};

struct ModelSection {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int block_size = 64;          // context length T
  int vocab_size = 0;           // 0 = take it from the data's tokenizer
  float dropout = 0.0f;         // attention-probability and residual dropout
  bool tied_embeddings = true;  // LM head shares the token embedding (GPT-2); false is not supported yet
};

struct DataSection {
  std::string train = "data/shakespeare_char/train.bin";  // token shard file or glob (llm.c layout)
  std::string val = "data/shakespeare_char/val.bin";
  std::string tokenizer = "";       // tokenizer.json written by `prepare`; "" = next to the train shard if present
  std::string sampling = "random";  // random | sequential
};

struct TrainingSection {
  int64_t steps = 2000;
  int micro_batch_size = 12;           // sequences per forward/backward
  int64_t global_batch_sequences = 0;  // 0 = micro_batch_size (or from global_batch_tokens)
  int64_t global_batch_tokens = 0;     // alternative to global_batch_sequences; must be a multiple of T
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 100;
  std::string lr_schedule = "cosine";  // cosine | linear | constant
  int64_t decay_steps = 0;             // 0 = steps
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;       // global-norm clip; 0 = off
  int64_t eval_interval = 250;  // 0 = no eval except at the end
  int eval_batches = 20;
  std::string activation_checkpointing = "none";  // none | full | every:N | selective
  std::string nonfinite = "stop";                 // stop | skip_step: on a non-finite loss or gradient
};

struct ParallelSection {
  std::string strategy = "auto";          // single | ddp | zero1 | zero2 | zero3 | hybrid | auto
  float device_memory_gb = 0.0f;          // auto: memory per rank to fit in (1 GB = 1e9 bytes); 0 = the device's
  float device_memory_reserve_gb = 2.0f;  // cuda: device memory kept free for what the plan does not count
  int shard_group_size = 0;               // hybrid: ranks per shard group S; 0 = ranks per node
  std::string hybrid_inner = "zero3";     // hybrid: zero2 | zero3 inside each shard group
  int prefetch = 1;                       // zero3: units all-gathered ahead of use (0..2)
  bool reshard_after_forward = true;      // zero3: free a unit after its forward, gather again for backward
  float bucket_mb = 25.0f;                // ddp: gradient bytes per all-reduce bucket (MiB); 0 = one per unit
  std::string param_dtype = "fp32";       // fp32 | bf16: parameters as stored and communicated
  std::string reduce_dtype = "fp32";      // fp32 | bf16: gradients as communicated
  bool stochastic_rounding = false;       // bf16 params: round from the master weights stochastically
};

struct CheckpointSection {
  int64_t every = 0;      // steps between checkpoints (and one after the last step); 0 = none
  int keep_last = 3;      // step directories kept; 0 = all
  std::string dir;        // "" = <out_dir>/checkpoints
  std::string resume;     // "" | auto | a step directory
  std::string init_from;  // "" | a model directory, step directory or checkpoint root: the weights to start from
  bool async = false;     // write in a background thread after copying the slices to host memory
};

struct CommSection {
  float timeout_s = 300.0f;        // a collective running longer ends the job with a diagnosis; 0 = no watchdog
  float save_timeout_s = 1800.0f;  // the same for the checkpoint writer's collectives (they wait on file systems)
};

struct LoggingSection {
  std::string level = "info";                  // trace | debug | info | warn | error
  int64_t log_interval = 10;                   // steps between plain progress lines when stdout is not a terminal
  std::string metrics_file = "metrics.jsonl";  // inside out_dir
  float peak_tflops = 0.0f;                    // per GPU, for MFU; 0 = from the GPU's name (none on the CPU)
};

struct RunConfig {
  RunSection run;
  ModelSection model;
  DataSection data;
  TrainingSection training;
  ParallelSection parallel;
  CheckpointSection checkpoint;
  CommSection comm;
  LoggingSection logging;

  // Where each key's value came from, "file.yaml:12:5", "--set", or absent for a default; used by
  // checks that can only happen later (against the data) to name the place to fix.
  std::map<std::string, std::string> origin;
  std::string where(const std::string& key) const {
    auto it = origin.find(key);
    return it == origin.end() ? std::string("(default)") : it->second;
  }
  // Derived (after validation): sequences per optimizer step and micro-batches per step.
  int64_t global_batch() const;
  int64_t grad_accum_steps() const { return global_batch() / training.micro_batch_size; }
  // run.gelu_fusion with auto decided: full on cuda with bf16 parameters (measured faster there), else none.
  std::string gelu_fusion() const;
};

}  // namespace gpt
