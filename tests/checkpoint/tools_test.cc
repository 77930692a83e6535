// End-to-end tests of `gpt-train checkpoint inspect|verify|consolidate` and `sample --checkpoint` on a tiny
// checkpoint trained by the binary. The consolidated safetensors file is read back twice: here (a few values,
// transposed ones included, against load_model) and by scripts/reference/read_safetensors.py, an independent
// json + numpy reader that compares every value with the shard files (skipped, visibly, without numpy).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_import.h"
#include "checkpoint/model_file.h"
#include "checkpoint/safetensors.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "model/layout.h"
#include "testing/run_command.h"
#include "testing/temp_dir.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::gpt_train;
using testing::run_command;
using testing::TempDir;

const std::string kPython = "/usr/bin/python3";
const std::string kReader = std::string(GPT_SOURCE_DIR) + "/scripts/reference/read_safetensors.py";

// One run, trained once for all test cases: checkpoints at steps 5 and 10, final weights in out/model.
struct TrainedRun {
  TempDir dir;
  std::string out, step10, model;
};

const TrainedRun& trained_run() {
  static TrainedRun r;
  static const bool trained = [] {
    const std::string data = r.dir.file("data");
    r.out = r.dir.file("out");
    const auto prep =
        run_command(gpt_train() + " prepare --input " + GPT_SHARED_DATA_DIR + "/tinyshakespeare.txt --out " + data);
    INFO(prep.output);
    REQUIRE(prep.exit_code == 0);
    const std::string yaml = "run: {out_dir: " + r.out +
                             ", threads: 1, seed: 3}\n"
                             "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}\n" +
                             "data: {train: " + data + "/train.bin, val: " + data + "/val.bin}\n" +
                             "training: {steps: 10, micro_batch_size: 4, global_batch_sequences: 8, "
                             "eval_interval: 0, eval_batches: 2, warmup_steps: 2}\n"
                             "checkpoint: {every: 5}\n";
    const std::string cfg = r.dir.write("run.yaml", yaml);
    const auto train = run_command(gpt_train() + " train --config " + cfg);
    INFO(train.output);
    REQUIRE(train.exit_code == 0);
    r.step10 = r.out + "/checkpoints/step_00000010";
    r.model = r.out + "/model";
    REQUIRE(fs::exists(r.step10 + "/manifest.json"));
    REQUIRE(fs::exists(r.model + "/manifest.json"));
    return true;
  }();
  REQUIRE(trained);
  return r;
}

CommandResult tool(const std::string& args) { return run_command(gpt_train() + " checkpoint " + args); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void flip_byte(const std::string& path, int64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(offset);
  f.write(&c, 1);
  REQUIRE(f);
}

std::string copy_dir(const std::string& from, const TempDir& tmp, const std::string& name) {
  const std::string to = tmp.file(name);
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

bool python_with_numpy() { return run_command(kPython + " -c 'import numpy'").exit_code == 0; }

// The file's header (as YAML, a superset of JSON) and its data section.
struct Safetensors {
  YAML::Node header;
  std::string data;
  uint64_t header_bytes = 0;
  std::vector<float> tensor(const std::string& name) const {
    const YAML::Node t = header[name];
    REQUIRE(t);
    const auto begin = t["data_offsets"][0].as<size_t>(), end = t["data_offsets"][1].as<size_t>();
    REQUIRE(end <= data.size());
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), data.data() + begin, end - begin);
    return v;
  }
  std::vector<int64_t> shape(const std::string& name) const { return header[name]["shape"].as<std::vector<int64_t>>(); }
};

Safetensors read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(bytes.size() >= 8);
  Safetensors s;
  for (int i = 0; i < 8; ++i) s.header_bytes |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  REQUIRE((8 + s.header_bytes) % 8 == 0);
  REQUIRE(8 + s.header_bytes <= bytes.size());
  s.header = YAML::Load(bytes.substr(8, s.header_bytes));
  s.data = bytes.substr(8 + s.header_bytes);
  return s;
}

TEST_CASE("checkpoint inspect summarises the manifest", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  auto r = tool("inspect " + run.step10);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const char* part :
       {"checkpoint, format version 2", "step:          10", "strategy single", "world size 1", "shard group 1",
        "params fp32", "next global batch 10", "10 steps taken", "master, adam_m, adam_v", "shard files:   1,",
        "shard_00000.bin  rank 0,", "4 slices", "tokenizer.json (present)", "n_layer 2, n_head 2, n_embd 32"}) {
    CHECK(contains(r.output, part));
  }
  // A checkpoint root: the step its `latest` names.
  r = tool("inspect " + run.out + "/checkpoints");
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "step_00000010"));
  // A model directory: weights only.
  r = tool("inspect " + run.model);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "model, format version 2"));
  CHECK(contains(r.output, "weights only"));
  CHECK(contains(r.output, "sections:      master (fp32)"));
}

TEST_CASE("checkpoint inspect fails clearly on a missing directory or a bad manifest", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  TempDir tmp;
  auto r = tool("inspect " + tmp.file("nowhere"));
  CHECK(r.exit_code != 0);
  CHECK(contains(r.output, tmp.file("nowhere") + ": no such checkpoint directory"));
  const std::string bad = copy_dir(run.step10, tmp, "bad");
  tmp.write("bad/manifest.json", "{\"format\": \"gpt-train checkpoint\", \"version\": 2, \"model\": {");
  r = tool("inspect " + bad);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, bad + "/manifest.json: malformed manifest"));
  // A missing shard and a truncated tokenizer are shown, and the exit status says so.
  const std::string damaged = copy_dir(run.step10, tmp, "damaged");
  fs::remove(damaged + "/shard_00000.bin");
  r = tool("inspect " + damaged);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "shard_00000.bin  rank 0,"));
  CHECK(contains(r.output, "[MISSING]"));
  CHECK(contains(r.output, damaged + ": 1 file(s) the manifest names are missing or the wrong size"));
}

TEST_CASE("checkpoint verify passes a good checkpoint and names the shard with a flipped byte", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  auto r = tool("verify " + run.step10);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const int64_t bytes = static_cast<int64_t>(fs::file_size(run.step10 + "/shard_00000.bin"));
  CHECK(contains(r.output, "OK: 1 shard files, " + std::to_string(bytes) + " bytes verified"));
  CHECK(tool("verify " + run.model).exit_code == 0);
  const std::string v1 = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/reference";  // a version 1 model
  r = tool("verify " + v1);
  CHECK(contains(r.output,
                 "OK: 1 shard files, " + std::to_string(fs::file_size(v1 + "/shard_00000.bin")) + " bytes verified"));

  TempDir tmp;
  const std::string bad = copy_dir(run.step10, tmp, "bad");
  SECTION("a byte of master weights") { flip_byte(bad + "/shard_00000.bin", 100); }
  SECTION("a byte of adam_v, the last section") { flip_byte(bad + "/shard_00000.bin", bytes - 3); }
  r = tool("verify " + bad);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, bad + "/shard_00000.bin: checksum mismatch"));
}

TEST_CASE("checkpoint consolidate writes Hugging Face GPT-2 safetensors equal to the weights", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  TempDir tmp;
  const std::string out = tmp.file("model.safetensors");
  auto r = tool("consolidate " + run.step10 + " --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "28 tensors"));
  CHECK_FALSE(fs::exists(out + ".tmp"));

  // Here: the container, the shapes and some values against load_model, transposed ones included.
  auto saved = load_model(run.step10);
  REQUIRE(saved);
  const ModelLayout layout = ModelLayout::build(saved->shape);
  const int64_t C = 32, V = saved->shape.vocab_size;
  const Safetensors st = read_safetensors(out);
  CHECK(st.data.size() == static_cast<size_t>(layout.total_numel) * 4);
  CHECK(st.header["__metadata__"]["format"].as<std::string>() == "pt");
  CHECK(st.shape("wte.weight") == std::vector<int64_t>{V, C});
  CHECK(st.shape("wpe.weight") == std::vector<int64_t>{32, C});
  CHECK(st.shape("h.1.attn.c_attn.weight") == std::vector<int64_t>{C, 3 * C});
  CHECK(st.shape("h.1.attn.c_attn.bias") == std::vector<int64_t>{3 * C});
  CHECK(st.shape("h.0.mlp.c_fc.weight") == std::vector<int64_t>{C, 4 * C});
  CHECK(st.shape("h.0.mlp.c_proj.weight") == std::vector<int64_t>{4 * C, C});
  CHECK(st.shape("ln_f.bias") == std::vector<int64_t>{C});
  auto weight = [&](int unit, const std::string& param, int64_t i) {
    int64_t base = 0;
    for (int u = 0; u < unit; ++u) base += layout.units[u].numel;
    return saved->weights[static_cast<size_t>(base + layout.units[unit].param(param).offset + i)];
  };
  const std::vector<float> wte = st.tensor("wte.weight");
  CHECK(wte[5 * C + 7] == weight(0, "wte", 5 * C + 7));
  const std::vector<float> c_attn = st.tensor("h.1.attn.c_attn.weight");  // (C, 3C) = qkv (3C, C) transposed
  for (int64_t in : {0, 3, 31}) {
    for (int64_t out_f : {0, 40, 95}) CHECK(c_attn[in * 3 * C + out_f] == weight(2, "attn.qkv.weight", out_f * C + in));
  }
  const std::vector<float> c_proj = st.tensor("h.0.mlp.c_proj.weight");  // (4C, C) = proj (C, 4C) transposed
  CHECK(c_proj[100 * C + 9] == weight(1, "mlp.proj.weight", 9 * 4 * C + 100));
  CHECK(st.tensor("ln_f.bias")[31] == weight(3, "ln_f.bias", 31));

  // The independent reader: every value, against the shard files.
  if (!python_with_numpy()) {
    WARN("SKIPPED the independent check by scripts/reference/read_safetensors.py: " + kPython +
         " with numpy is not available");
    return;
  }
  r = run_command(kPython + " " + kReader + " " + out + " --source " + run.step10);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "OK: 28 tensors"));
  // ... which does fail on a wrong value of a transposed tensor,
  const std::string flipped = tmp.file("flipped.safetensors");
  fs::copy_file(out, flipped);
  const auto begin = st.header["h.1.mlp.c_fc.weight"]["data_offsets"][0].as<int64_t>();
  flip_byte(flipped, 8 + static_cast<int64_t>(st.header_bytes) + begin + 4 * 77 + 1);
  r = run_command(kPython + " " + kReader + " " + flipped + " --source " + run.step10);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, "h.1.mlp.c_fc.weight: 1 of 4096 values differ"));
  // ... and on the weights of another step.
  r = run_command(kPython + " " + kReader + " " + out + " --source " + run.out + "/checkpoints/step_00000005");
  CHECK(r.exit_code == 1);
}

// --out DIR/: model.safetensors and Hugging Face's config.json. scripts/reference/hf_gpt2_greedy.py runs GPT-2 as
// HF's GPT2LMHeadModel reads that directory (numpy only) and must continue a prompt greedily as gpt-train's sample
// does with --top-k 1: 44 tokens, 12 of them past the block size of 32, where both slide the context (the
// sampler's KV cache for the first 32, then its window run whole).
TEST_CASE("checkpoint consolidate --out DIR/ writes a Hugging Face GPT-2 directory", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  TempDir tmp;
  const std::string dir = tmp.file("hf") + "/";
  auto r = tool("consolidate " + run.model + " --out " + dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(fs::exists(dir + "model.safetensors"));
  std::ifstream f(dir + "config.json");
  const std::string config((std::istreambuf_iterator<char>(f)), {});
  auto saved = load_model(run.model);
  REQUIRE(saved);
  for (const std::string& field : std::vector<std::string>{
           "\"architectures\": [\"GPT2LMHeadModel\"]", "\"n_layer\": 2,", "\"n_head\": 2,", "\"n_embd\": 32,",
           "\"n_positions\": 32,", "\"vocab_size\": " + std::to_string(saved->shape.vocab_size) + ",",
           "\"activation_function\": \"gelu_new\"", "\"layer_norm_epsilon\": 1e-05", "\"tie_word_embeddings\": true"}) {
    CAPTURE(field);
    CHECK(contains(config, field));
  }
  CHECK_FALSE(contains(config, "bos_token_id"));  // a character vocabulary has no <|endoftext|>
  if (!python_with_numpy()) {
    WARN("SKIPPED the Hugging Face forward by scripts/reference/hf_gpt2_greedy.py: " + kPython +
         " with numpy is not available");
    return;
  }
  const std::string greedy = std::string(GPT_SOURCE_DIR) + "/scripts/reference/hf_gpt2_greedy.py";
  const auto hf = run_command(kPython + " " + greedy + " " + dir + " --prompt-ids 20,21,22,23 --tokens 40 2>&1");
  const auto ours = run_command(gpt_train() + " sample --model " + run.model +
                                " --prompt-ids 20,21,22,23 --ids --top-k 1 -n 40 --threads 2 2>/dev/null");
  INFO(hf.output);
  INFO(ours.output);
  REQUIRE(hf.exit_code == 0);
  REQUIRE(ours.exit_code == 0);
  auto words = [](const std::string& text) {
    std::istringstream in(text);
    std::vector<std::string> w;
    for (std::string x; in >> x;) w.push_back(x);
    return w;
  };
  CHECK(words(hf.output).size() == 44);
  CHECK(words(hf.output) == words(ours.output));
}

TEST_CASE("checkpoint consolidate reads model directories, version 1 included", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  TempDir tmp;
  const std::string v1 = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/reference";
  for (const std::string& src : {run.model, v1}) {
    const std::string out = tmp.file("m.safetensors");
    auto r = tool("consolidate " + src + " -o " + out);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    if (!python_with_numpy()) {
      WARN("SKIPPED the independent check by scripts/reference/read_safetensors.py: " + kPython +
           " with numpy is not available");
      continue;
    }
    r = run_command(kPython + " " + kReader + " " + out + " --source " + src);
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "OK: 28 tensors"));
  }
}

TEST_CASE("checkpoint consolidate leaves no file behind on errors", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  TempDir tmp;
  const std::string bad = copy_dir(run.step10, tmp, "bad");
  flip_byte(bad + "/shard_00000.bin", 200);
  const std::string out = tmp.file("model.safetensors");
  auto r = tool("consolidate " + bad + " --out " + out);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, bad + "/shard_00000.bin: checksum mismatch"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out + ".tmp"));
  r = tool("consolidate " + run.step10 + " --out " + tmp.file("no/such/dir/model.safetensors"));
  CHECK(r.exit_code == 1);
  CHECK(contains(r.output, tmp.file("no/such/dir/model.safetensors.tmp") + ": open for writing failed"));
  CHECK(tool("consolidate " + run.step10).exit_code != 0);  // --out is required
  // A directory export that fails leaves no directory it made behind.
  r = tool("consolidate " + bad + " --out " + tmp.file("hf") + "/");
  CHECK(r.exit_code == 2);
  CHECK_FALSE(fs::exists(tmp.file("hf")));
  // Into a directory with a previous export: a file it cannot replace (config.json a directory) is found before any
  // is written, so the previous weights stay; another tokenizer's files there (which import would read with these
  // weights) are refused the same way.
  REQUIRE(tool("consolidate " + run.model + " --out " + tmp.file("prev") + "/").exit_code == 0);
  std::string before;
  REQUIRE(read_file(tmp.file("prev/model.safetensors"), &before).is_ok());
  fs::remove(tmp.file("prev/config.json"));
  fs::create_directories(tmp.file("prev/config.json"));
  r = tool("consolidate " + run.step10 + " --out " + tmp.file("prev") + "/");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "config.json"));
  std::string after;
  REQUIRE(read_file(tmp.file("prev/model.safetensors"), &after).is_ok());
  CHECK(after == before);
  fs::remove(tmp.file("prev/config.json"));
  tmp.write("prev/tokenizer.json", R"({"type":"byte"})");
  r = tool("consolidate " + run.step10 + " --out " + tmp.file("prev") + "/");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, tmp.file("prev/tokenizer.json") + " is there and is not this model's tokenizer"));
  REQUIRE(read_file(tmp.file("prev/model.safetensors"), &after).is_ok());
  CHECK(after == before);
}

TEST_CASE("sample --checkpoint generates from a checkpoint's master weights", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  auto r = run_command(gpt_train() + " sample --checkpoint " + run.step10 + " --tokens 20 --threads 1");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  r = run_command(gpt_train() + " sample --checkpoint " + run.out + "/checkpoints --tokens 5 --threads 1");
  CHECK(r.exit_code == 0);
  r = run_command(gpt_train() + " sample --checkpoint " + run.step10 + " --model " + run.model + " --tokens 5");
  CHECK(r.exit_code != 0);
  CHECK(contains(r.output, "excludes"));
}

// One safetensors file of (name, dtype, shape, bytes) tensors, written as Hugging Face's library does.
struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void write_safetensors(const std::string& path, const std::vector<StTensor>& tensors) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  size_t at = 0;
  for (const StTensor& t : tensors) {
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) header += ',';
      header += std::to_string(t.shape[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t.bytes.size()) + "]}";
    at += t.bytes.size();
  }
  header += "}";
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  for (const StTensor& t : tensors) out << t.bytes;
}

// checkpoint import: the inverse of consolidate --out DIR/, bit for bit; and a file as transformers saves GPT-2
// (GPT2LMHeadModel's "transformer." names, bf16 and f16 tensors, the attention's mask buffers, a tied lm_head.weight)
// gives the values those dtypes hold. Bad sources are errors that name the file and the tensor or key.
TEST_CASE("checkpoint import reads Hugging Face GPT-2 weights into a model directory", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  auto saved = load_model(run.model);
  REQUIRE(saved);
  TempDir tmp;
  REQUIRE(tool("consolidate " + run.model + " --out " + tmp.file("hf") + "/").exit_code == 0);
  auto r = tool("import " + tmp.file("hf") + " --out " + tmp.file("m"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  auto back = load_model(tmp.file("m"));
  REQUIRE(back);
  CHECK(back->shape.n_embd == saved->shape.n_embd);
  CHECK(back->shape.vocab_size == saved->shape.vocab_size);
  CHECK(back->weights == saved->weights);
  r = tool("import " + tmp.file("hf") + " --out " + tmp.file("m"));
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "already exists"));
  // The directory --out goes into is the user's: nothing else in it is touched (a checkpoint root's clean-up of
  // stale ".tmp-*" entries and of later step directories is not for it).
  tmp.write(".tmp-notes.txt", "mine");
  std::filesystem::create_directories(tmp.file("step_00000009"));
  REQUIRE(tool("import " + tmp.file("hf") + " --out " + tmp.file("step_00000003")).exit_code == 0);
  CHECK(std::filesystem::exists(tmp.file(".tmp-notes.txt")));
  CHECK(std::filesystem::exists(tmp.file("step_00000009")));

  // As transformers writes it: every weight in bf16 (ln_f.weight in f16), transposed Conv1D weights.
  const ModelLayout layout = ModelLayout::build(saved->shape);
  std::vector<int64_t> unit_offset;
  for (int64_t at = 0; const UnitLayout& u : layout.units) {
    unit_offset.push_back(at);
    at += u.numel;
  }
  std::vector<float> want(saved->weights.size());
  std::vector<StTensor> tensors;
  for (const HfTensor& t : hf_gpt2_tensors(layout)) {
    const ParamSpec& p = layout.units[t.unit].params[t.param];
    const int64_t base = unit_offset[t.unit] + p.offset;
    const bool f16 = t.name == "ln_f.weight";
    StTensor st{"transformer." + t.name, f16 ? "F16" : "BF16", t.shape, std::string(2 * p.numel, '\0')};
    for (int64_t i = 0; i < p.numel; ++i) {
      // Element i of the file's tensor, and where it lands in ours (Conv1D: the file's (in, out) is our (out, in)).
      const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
      const int64_t ours = t.transpose ? (i % cols) * rows + i / cols : i;
      const float x = saved->weights[base + ours];
      uint16_t bits = f32_to_bf16(x).bits;
      want[base + ours] = bf16_to_f32(bf16{bits});
      if (f16) {  // LayerNorm weights near 1: normal halves, the mantissa cut to 10 bits
        const uint32_t u = std::bit_cast<uint32_t>(x);
        bits =
            static_cast<uint16_t>(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112) << 10) | ((u >> 13) & 0x3ffu));
        want[base + ours] = std::bit_cast<float>(u & 0xffffe000u);
      }
      std::memcpy(st.bytes.data() + 2 * i, &bits, 2);
    }
    tensors.push_back(std::move(st));
    if (t.name == "wte.weight") {
      tensors.push_back(tensors.back());
      tensors.back().name = "lm_head.weight";
    }
    if (t.name.find("attn.c_attn.bias") != std::string::npos) {  // the causal mask buffer beside it
      const int64_t T = saved->shape.block_size;
      tensors.push_back({"transformer." + t.name.substr(0, t.name.find("c_attn")) + "bias",
                         "F32",
                         {1, 1, T, T},
                         std::string(4 * T * T, '\0')});
    }
  }
  const std::string dir = tmp.file("gpt2");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(tmp.file("hf") + "/config.json", dir + "/config.json");
  write_safetensors(dir + "/model.safetensors", tensors);
  r = tool("import " + dir + "/model.safetensors --out " + tmp.file("m2"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  back = load_model(tmp.file("m2"));
  REQUIRE(back);
  CHECK(back->weights == want);

  // Errors: each names the file and what is wrong.
  auto fails = [&](const std::vector<StTensor>& ts, const std::string& config_text, const std::string& message) {
    CAPTURE(message);
    TempDir bad;
    bad.write("config.json", config_text);
    write_safetensors(bad.file("model.safetensors"), ts);
    const auto res = tool("import " + bad.file("") + " --out " + bad.file("out"));
    INFO(res.output);
    CHECK(res.exit_code == 2);
    CHECK(contains(res.output, message));
    CHECK_FALSE(std::filesystem::exists(bad.file("out")));
  };
  std::ifstream cf(dir + "/config.json");
  const std::string config((std::istreambuf_iterator<char>(cf)), {});
  std::string relu = config;
  relu.replace(relu.find("gelu_new"), 8, "relu");
  fails(tensors, relu, "activation_function \"relu\": gpt-train's GELU is the tanh approximation");
  std::string typed = config;
  typed.replace(typed.find("1e-05"), 5, "\"abc\"");
  fails(tensors, typed, "config.json: \"layer_norm_epsilon\" is a string, expected a number");
  std::string twice = config;  // yaml-cpp took the first of the two
  twice.insert(twice.find('{') + 1, "\n  \"n_layer\": 7,");
  fails(tensors, twice,
        "config.json: not valid JSON: line 9, column 3: the key \"n_layer\" again (first at line 2, column 3)");
  std::string inner = config;
  inner.replace(inner.find("\"n_inner\": null"), 15, "\"n_inner\": 7");
  fails(tensors, inner, "config.json: n_inner 7: gpt-train's MLP is 4 * n_embd");
  std::vector<StTensor> missing = tensors;
  missing.erase(std::find_if(missing.begin(), missing.end(),
                             [](const StTensor& t) { return t.name == "transformer.h.1.mlp.c_fc.weight"; }));
  fails(missing, config, "model.safetensors: no tensor h.1.mlp.c_fc.weight");
  std::vector<StTensor> extra = tensors;
  extra.push_back({"transformer.h.0.attn.rotary", "F32", {1}, std::string(4, '\0')});
  fails(extra, config, "unexpected tensor h.0.attn.rotary");
  std::vector<StTensor> untied = tensors;
  for (StTensor& t : untied) {
    if (t.name == "lm_head.weight") t.bytes[0] ^= 1;
  }
  fails(untied, config, "lm_head.weight differs from wte.weight");
  std::vector<StTensor> misshapen = tensors;
  misshapen[0].shape = {misshapen[0].shape[1], misshapen[0].shape[0]};
  fails(misshapen, config, "tensor wte.weight is (");
  TempDir sharded;
  sharded.write("config.json", config);
  sharded.write("model.safetensors.index.json", "{}");
  r = tool("import " + sharded.file("") + " --out " + tmp.file("m3"));
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "the weights are sharded (model.safetensors.index.json)"));
  r = tool("import " + tmp.file("nowhere") + " --out " + tmp.file("m3"));
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, tmp.file("nowhere") + ": no such file or directory"));
  TempDir no_config;  // a directory without config.json
  no_config.write("model.safetensors", "");
  r = tool("import " + no_config.file("") + " --out " + tmp.file("m3"));
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "config.json: missing"));
}

// sample --device cuda: with a GPU, the greedy continuation of the CPU (fp32 both; scripts/gpu/check.sh compares the
// two on a trained model too); without one (or without CUDA built in), an error that names --device, before the
// model is read, and a visible skip.
TEST_CASE("sample --device: cuda continues greedily as the CPU does, or says why it cannot", "[checkpoint][tools]") {
  const TrainedRun& run = trained_run();
  const std::string greedy = gpt_train() + " sample --model " + run.model + " --prompt-ids 5,6,7 --ids --top-k 1 -n 40";
  const auto cpu = run_command(greedy + " --device cpu");
  REQUIRE(cpu.exit_code == 0);
  auto bad = run_command(gpt_train() + " sample --model " + run.model + " --device tpu -n 3");
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "--device: device 'tpu': expected cpu or cuda"));
  bad = run_command(gpt_train() + " sample --model /nonexistent --device tpu -n 3");
  CHECK(contains(bad.output, "--device"));  // the device first, then the model
  const auto gpu = run_command(greedy + " --device cuda");
  if (gpu.exit_code != 0 && contains(gpu.output, "--device: device 'cuda': ")) {
    WARN("SKIPPED sample --device cuda: " + gpu.output);
    return;
  }
  INFO(gpu.output);
  REQUIRE(gpu.exit_code == 0);
  const auto ids = [](const std::string& text) {  // the digits-and-spaces line among the log lines
    std::istringstream in(text);
    std::string line, found;
    while (std::getline(in, line)) {
      if (!line.empty() && line.find_first_not_of("0123456789 ") == std::string::npos) found = line;
    }
    return found;
  };
  CHECK(ids(gpu.output) == ids(cpu.output));
  CHECK(ids(cpu.output).size() > 80);
}

}  // namespace
}  // namespace gpt
