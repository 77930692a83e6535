// End-to-end tests of the gpt-train binary: prepare -> train -> sample on a small corpus, and every
// class of bad input ending in a clear message, a non-zero exit code and nothing written.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "testing/run_command.h"
#include "testing/temp_dir.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;
using testing::gpt_train;
using testing::run_command;
using testing::TempDir;

// A few KB of text with a small alphabet, prepared into dir/data.
std::string prepare_corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "the cat sat on the mat. a dog ran to the cat.\n";
  const std::string input = dir.write("corpus.txt", text);
  const auto r = run_command(gpt_train() + " prepare --input " + input + " --out " + dir.file("data"));
  REQUIRE(r.exit_code == 0);
  return dir.file("data");
}

std::string tiny_config(const std::string& data_dir, const std::string& out_dir, const std::string& extra = "") {
  return "run:\n  out_dir: " + out_dir +
         "\nmodel:\n  n_layer: 2\n  n_head: 2\n  n_embd: 32\n  block_size: 32\n"
         "data:\n  train: " +
         data_dir + "/train.bin\n  val: " + data_dir +
         "/val.bin\n"
         "training:\n  steps: 60\n  micro_batch_size: 8\n  global_batch_sequences: 16\n  warmup_steps: 5\n"
         "  lr: 3.0e-3\n  eval_interval: 30\n  eval_batches: 4\n" +
         extra;
}

// The command's exit code is `code` and its output holds each of `texts`.
void expect(const testing::CommandResult& r, int code, const std::vector<std::string>& texts) {
  INFO(r.output);
  CHECK(r.exit_code == code);
  for (const std::string& t : texts) CHECK(r.output.find(t) != std::string::npos);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_CASE("prepare, train and sample end to end, resolved config and metrics are saved", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(data, out));
  const auto r = run_command(gpt_train() + " train --config " + cfg + " --set run.threads=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.output.find("[rank 0]") != std::string::npos);
  REQUIRE(r.output.find("ETA") != std::string::npos);
  REQUIRE(r.output.find("MFU") == std::string::npos);  // no known peak on the CPU
  {
    std::ifstream summary(out + "/summary.json");
    const std::string s((std::istreambuf_iterator<char>(summary)), {});
    REQUIRE(s.find("\"mfu\": null") != std::string::npos);
    // What step 1 was planned to take, beside the measured peaks.
    REQUIRE(s.find("\"mem_planned_bytes\": {\"params\": ") != std::string::npos);
    REQUIRE(s.find("\"device_memory_bytes\": null") != std::string::npos);  // a CPU run: no driver's count
    // Throughput over the training steps alone (train_seconds, the steps' step_ms summed), not the loop's wall time
    // with its evaluations and saves (seconds).
    auto number = [&s](const std::string& key) {
      const size_t at = s.find("\"" + key + "\": ");
      REQUIRE(at != std::string::npos);
      return std::stod(s.substr(at + key.size() + 4));
    };
    CHECK(number("train_seconds") > 0.0);
    CHECK(number("train_seconds") <= number("seconds"));
    const double tokens = 60.0 * 16 * 32;  // tiny_config: steps x global batch x block size
    CHECK(number("tokens_per_s") == Approx(tokens / number("train_seconds")).epsilon(0.01));
  }
  // With a stated peak, MFU = achieved FLOP/s / peak appears in the progress lines and the summary.
  const auto with_peak = run_command(gpt_train() + " train --config " + cfg + " --set run.threads=2" +
                                     " --set logging.peak_tflops=1000 --set run.out_dir=" + dir.file("run-mfu"));
  REQUIRE(with_peak.exit_code == 0);
  REQUIRE(with_peak.output.find("% | mem") != std::string::npos);
  REQUIRE(with_peak.output.find("MFU ") != std::string::npos);
  {
    std::ifstream summary(dir.file("run-mfu") + "/summary.json");
    const std::string s((std::istreambuf_iterator<char>(summary)), {});
    // Tens of GFLOP/s of a 1000 TFLOP/s peak: a number, under 1e-3 (printed to 4 places, so 0.0000 on a slow CPU).
    const size_t at = s.find("\"mfu\": ");
    REQUIRE(at != std::string::npos);
    const std::string value = s.substr(at + 7, s.find_first_of(",}\n", at) - at - 7);
    INFO(value);
    REQUIRE(value.find_first_not_of("0123456789.") == std::string::npos);
    CHECK(std::stod(value) < 1e-3);
  }
  REQUIRE(fs::exists(out + "/config.yaml"));
  REQUIRE(fs::exists(out + "/model/manifest.json"));
  REQUIRE(fs::exists(out + "/model/tokenizer.json"));
  // The resolved config records the override and reloads.
  std::ifstream resolved(out + "/config.yaml");
  const std::string text((std::istreambuf_iterator<char>(resolved)), {});
  REQUIRE(text.find("threads: 2") != std::string::npos);
  // One metrics line per step, with val loss at the eval steps and memory peaks.
  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line, last;
  int lines = 0, with_val = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    with_val += line.find("\"val_loss\"") != std::string::npos;
    last = line;
  }
  REQUIRE(lines == 60);
  REQUIRE(with_val == 2);
  REQUIRE(last.find("\"mem_peak_bytes\":{\"params\":") != std::string::npos);
  // The model learned the corpus: the final loss is far below uniform (ln 15 = 2.7).
  const double final_val = std::stod(last.substr(last.find("\"val_loss\":") + 11));
  REQUIRE(final_val < 1.2);

  const auto s = run_command(gpt_train() + " sample --run " + out + " --prompt 'the ' --tokens 40 --seed 3");
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  REQUIRE(s.output.rfind("the ", 0) == 0);
  REQUIRE(s.output.size() >= 44);
  // Same seed, same text.
  REQUIRE(run_command(gpt_train() + " sample --run " + out + " --prompt 'the ' --tokens 40 --seed 3").output ==
          s.output);
  // A CPU process never loads cuBLASLt (kernels/cuda/cublaslt_loader.h: 0.09 s and 210 MB resident, linked at start).
  const auto files = run_command("LD_DEBUG=files " + gpt_train() + " sample --run " + out + " --tokens 2 2>&1");
  CHECK(files.exit_code == 0);
  CHECK(files.output.find("file=libmpi.so") != std::string::npos);  // LD_DEBUG lists each library it loads
  CHECK(files.output.find("libcublasLt") == std::string::npos);
  // --num-samples 3: three continuations between dashed lines, the first the single sample's, each its own.
  const auto three =
      run_command(gpt_train() + " sample --run " + out + " --prompt 'the ' --tokens 40 --seed 3 --num-samples 3");
  INFO(three.output);
  REQUIRE(three.exit_code == 0);
  std::vector<std::string> parts;
  const std::string sep = "\n---------------\n";
  for (size_t at = 0;;) {
    const size_t next = three.output.find(sep, at);
    parts.push_back(three.output.substr(at, next == std::string::npos ? std::string::npos : next - at));
    if (next == std::string::npos) break;
    at = next + sep.size();
  }
  REQUIRE(parts.size() == 3);
  CHECK(parts[0] + "\n" == s.output);
  for (const std::string& p : parts) CHECK(p.rfind("the ", 0) == 0);
  CHECK(parts[1] != parts[0]);
  CHECK(parts[2] != parts[1] + "\n");
  CHECK(run_command(gpt_train() + " sample --run " + out + " --num-samples 0").exit_code == 2);
}

struct BadCase {
  std::string name, extra_yaml, set, expect1, expect2;
};

TEST_CASE("bad input: a clear message naming the place, exit code 2, nothing written", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  const std::string out = dir.file("never");
  const std::string small_tokenizer = dir.write("small.json", R"({"type":"char","vocab":["a","b"]})");
  // The shards alone, without the tokenizer.json prepare wrote beside them (as shards made elsewhere come).
  fs::create_directories(dir.file("raw"));
  fs::copy_file(data + "/train.bin", dir.file("raw/train.bin"));
  fs::copy_file(data + "/val.bin", dir.file("raw/val.bin"));
  const std::string raw = "data.train=" + dir.file("raw/train.bin") + " --set data.val=" + dir.file("raw/val.bin");
  const std::vector<BadCase> cases = {
      {"unknown key", "  n_hed: 4\n", "", "unknown key 'training.n_hed'", "run.yaml:"},
      {"unknown key via --set", "", "model.n_hed=4", "model.n_hed", "did you mean 'model.n_head'"},
      {"wrong type", "", "model.n_layer=four", "model.n_layer", "integer"},
      {"out of range", "", "training.lr=-1", "training.lr", "-1"},
      {"heads do not divide width", "", "model.n_head=5", "model.n_embd", "model.n_head"},
      {"block size longer than the data", "", "model.block_size=4096", "model.block_size", "4096"},
      {"vocab smaller than the data", "", "model.vocab_size=5", "model.vocab_size", "at least"},
      {"data ids outside the tokenizer", "", "data.tokenizer=" + small_tokenizer + " --set " + raw,
       "outside the tokenizer's 2 symbols", small_tokenizer},
      {"a data.tokenizer other than the shards'", "", "data.tokenizer=" + small_tokenizer,
       "is not the tokenizer the shards were prepared with", data + "/tokenizer.json differs"},
      {"data that is a directory", "", "data.train=" + data, data, "not a regular file"},
      {"run.out_dir that is a file", "", "run.out_dir=" + small_tokenizer, "run.out_dir", "is a file"},
      {"missing data", "", "data.train=" + dir.file("nope/train.bin"), "data.train", "nope/train.bin"},
      {"unknown device", "", "run.device=tpu", "run.device", "tpu"},
      // OpenMP's runtime crashed (a segfault) making a pool of 65536 threads.
      {"threads beyond any machine", "", "run.threads=65536", "run.threads", "4096"},
      {"metrics file over the run's config", "", "logging.metrics_file=config.yaml", "logging.metrics_file",
       "a name the run writes itself"},
      {"metrics file outside out_dir", "", "logging.metrics_file=../m.jsonl", "logging.metrics_file",
       "plain file name"},
      {"a second YAML document", "---\nmodel:\n  n_head: 4\n", "", "a second YAML document", "run.yaml:"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string cfg = dir.write("run.yaml", tiny_config(data, out, c.extra_yaml));
    const auto r = run_command(gpt_train() + " train --config " + cfg + (c.set.empty() ? "" : " --set " + c.set));
    INFO(r.output);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.output.find(c.expect1) != std::string::npos);
    REQUIRE(r.output.find(c.expect2) != std::string::npos);
    REQUIRE_FALSE(fs::exists(out));
  }
}

TEST_CASE("bad input: corrupt shards and a missing config file", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  const std::string out = dir.file("never");
  SECTION("missing config file") {
    const auto r = run_command(gpt_train() + " train --config " + dir.file("absent.yaml"));
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.output.find("absent.yaml") != std::string::npos);
  }
  SECTION("bad magic") {
    std::fstream f(data + "/val.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.write("\x01\x02\x03\x04", 4);
    f.close();
    const auto r = run_command(gpt_train() + " train --config " + dir.write("run.yaml", tiny_config(data, out)));
    INFO(r.output);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.output.find("val.bin") != std::string::npos);
    REQUIRE(r.output.find("20240520") != std::string::npos);
  }
  SECTION("truncated shard") {
    fs::resize_file(data + "/train.bin", fs::file_size(data + "/train.bin") - 7);
    const auto r = run_command(gpt_train() + " train --config " + dir.write("run.yaml", tiny_config(data, out)));
    INFO(r.output);
    REQUIRE(r.exit_code == 2);
    REQUIRE(r.output.find("train.bin") != std::string::npos);
  }
  REQUIRE_FALSE(fs::exists(out));
}

// GPT-2's BPE as Hugging Face publishes it (the fixture's small vocabulary in those files): prepare encodes each input
// as a document after <|endoftext|>, train takes the vocabulary's size, sample encodes the prompt and decodes text.
TEST_CASE("prepare with GPT-2's BPE files, train and sample text", "[apps]") {
  TempDir dir;
  const std::string bpe = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/bpe";
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the cat sat on the mat. a dog ran to the cat.\n";
  const std::string a = dir.write("a.txt", text), b = dir.write("b.txt", "Caf\xc3\xa9 au lait.\n" + text);
  const auto p =
      run_command(gpt_train() + " prepare -i " + a + " -i " + b + " --tokenizer " + bpe + " --out " + dir.file("data"));
  INFO(p.output);
  REQUIRE(p.exit_code == 0);
  CHECK(p.output.find("vocab 857 (tokenizer " + bpe + ")") != std::string::npos);
  auto train_shard = data::TokenShard::open(dir.file("data/train.bin"));
  REQUIRE(train_shard.has_value());
  auto tok = data::Tokenizer::load(dir.file("data/tokenizer.json"));
  REQUIRE(tok.has_value());
  CHECK(tok->kind() == data::TokenizerKind::kBpe);
  const auto first = tok->encode(text);
  REQUIRE(first.has_value());
  CHECK(train_shard->tokens()[0] == 856);  // <|endoftext|>, then a.txt's ids, then another, then b.txt's
  CHECK(std::equal(first->begin(), first->end(), train_shard->tokens().begin() + 1));
  CHECK(train_shard->tokens()[1 + first->size()] == 856);

  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(dir.file("data"), out));
  const auto r = run_command(gpt_train() + " train --config " + cfg + " --set training.steps=3 --set run.threads=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto s = run_command(gpt_train() + " sample --run " + out + " --threads 2 -n 8 --prompt 'the cat' 2>/dev/null");
  INFO(s.output);
  CHECK(s.exit_code == 0);
  CHECK(s.output.starts_with("the cat"));
  // <|endoftext|> in a prompt is that token (nanoGPT samples from it), and plain text around it is text.
  const auto eot = run_command(gpt_train() + " sample --run " + out +
                               " --threads 2 -n 1 --ids --prompt '<|endoftext|>the cat' 2>/dev/null");
  INFO(eot.output);
  CHECK(eot.exit_code == 0);
  {
    std::string want = "856";
    const std::vector<uint16_t> the_cat = *tok->encode("the cat");
    for (const uint16_t id : the_cat) want.append(" ").append(std::to_string(id));
    CHECK(eot.output.starts_with(want + " "));
  }
  // Exported as Hugging Face's files, the tokenizer's vocab.json and merges.txt with them, then imported: the model
  // directory keeps the tokenizer, so it samples text too, the same text as the run's model.
  REQUIRE(
      run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " + dir.file("hf") + "/").exit_code ==
      0);
  {  // config.json names the tokenizer's <|endoftext|> as Hugging Face's generate() stops at it
    std::ifstream in(dir.file("hf/config.json"));
    const std::string config((std::istreambuf_iterator<char>(in)), {});
    CHECK(config.find("\"bos_token_id\": 856,\n  \"eos_token_id\": 856,") != std::string::npos);
  }
  // Exported again over the first: a save_pretrained directory's tokenizer.json, when it is this model's, stays; a
  // failure to write (a file in the way of one) leaves the previous export whole.
  fs::copy_file(bpe + "/tokenizer.json", dir.file("hf/tokenizer.json"));
  std::string weights_before;
  {
    std::ifstream in(dir.file("hf/model.safetensors"), std::ios::binary);
    weights_before.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(
      run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " + dir.file("hf") + "/").exit_code ==
      0);
  const auto written = fs::last_write_time(dir.file("hf/model.safetensors"));
  fs::create_directories(dir.file("hf/merges.txt.consolidating/in_the_way"));
  const auto blocked =
      run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " + dir.file("hf") + "/");
  CHECK(blocked.exit_code != 0);
  CHECK(fs::last_write_time(dir.file("hf/model.safetensors")) == written);  // not replaced
  {
    std::ifstream in(dir.file("hf/model.safetensors"), std::ios::binary);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == weights_before);
  }
  CHECK_FALSE(fs::exists(dir.file("hf/model.safetensors.consolidating")));
  CHECK_FALSE(fs::exists(dir.file("hf/config.json.consolidating")));
  fs::remove_all(dir.file("hf/merges.txt.consolidating"));
  fs::remove(dir.file("hf/tokenizer.json"));
  // consolidate wrote them as GPT2Tokenizer reads them: the fixture's vocabulary and merges.
  auto exported = data::Tokenizer::load(dir.file("hf"));
  REQUIRE(exported.has_value());
  CHECK(exported->to_json() == tok->to_json());
  std::string merges_written, merges_fixture;
  {
    std::ifstream a_in(dir.file("hf/merges.txt")), b_in(bpe + "/merges.txt");
    merges_written.assign(std::istreambuf_iterator<char>(a_in), {});
    merges_fixture.assign(std::istreambuf_iterator<char>(b_in), {});
  }
  CHECK(merges_written == merges_fixture);
  const auto imported = run_command(gpt_train() + " checkpoint import " + dir.file("hf") + " --out " + dir.file("m"));
  INFO(imported.output);
  REQUIRE(imported.exit_code == 0);
  CHECK(imported.output.find("sample it with --prompt (its tokenizer came with it)") != std::string::npos);
  const auto s2 = run_command(gpt_train() + " sample --model " + dir.file("m") +
                              " --threads 2 -n 8 --prompt 'the cat' 2>/dev/null");
  CHECK(s2.exit_code == 0);
  CHECK(s2.output == s.output);
  // The weights named as a bare file name, in the directory that holds them: the tokenizer beside is found too.
  const auto bare_name = run_command("cd " + dir.file("hf") + " && " + gpt_train() +
                                     " checkpoint import model.safetensors --out " + dir.file("m3"));
  INFO(bare_name.output);
  CHECK(bare_name.exit_code == 0);
  CHECK(bare_name.output.find("its tokenizer came with it") != std::string::npos);
  // Tokenizer files that are not GPT-2's stop the import, naming them; --no-tokenizer imports the weights alone.
  fs::remove(dir.file("hf/merges.txt"));
  dir.write("hf/merges.txt", "#version: 0.2\nnot a merge line\n");
  const auto bad = run_command(gpt_train() + " checkpoint import " + dir.file("hf") + " --out " + dir.file("m2"));
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find(dir.file("hf/merges.txt") + ": line 2 is 'not a merge line'") != std::string::npos);
  CHECK(bad.output.find("--no-tokenizer") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("m2")));
  const auto bare =
      run_command(gpt_train() + " checkpoint import " + dir.file("hf") + " --no-tokenizer --out " + dir.file("m2"));
  CHECK(bare.exit_code == 0);
  CHECK(bare.output.find("sample it with --prompt-ids/--ids") != std::string::npos);
  // Not a tokenizer: named, nothing written.
  const auto missing = run_command(gpt_train() + " prepare -i " + a + " --tokenizer gpt3 --out " + dir.file("none"));
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("--tokenizer gpt3: expected char, byte, or a tokenizer file or directory") !=
        std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("none")));

  // Tokenizer files that do not belong together: refused at import, nothing written.
  fs::create_directories(dir.file("half"));
  fs::copy_file(dir.file("hf/model.safetensors"), dir.file("half/model.safetensors"));
  fs::copy_file(dir.file("hf/config.json"), dir.file("half/config.json"));
  fs::copy_file(bpe + "/vocab.json", dir.file("half/vocab.json"));
  const auto half = run_command(gpt_train() + " checkpoint import " + dir.file("half") + " --out " + dir.file("m4"));
  CHECK(half.exit_code == 2);
  CHECK(half.output.find(dir.file("half/vocab.json") + " is there without merges.txt") != std::string::npos);
  fs::copy_file(bpe + "/merges.txt", dir.file("half/merges.txt"));
  dir.write("half/tokenizer.json", R"({"type":"byte"})");
  const auto two = run_command(gpt_train() + " checkpoint import " + dir.file("half") + " --out " + dir.file("m4"));
  CHECK(two.exit_code == 2);
  CHECK(two.output.find("and vocab.json with merges.txt are not one tokenizer") != std::string::npos);
  CHECK_FALSE(fs::exists(dir.file("m4")));

  // --prompt-ids read strictly (CLI11's list took "" as token 0 and skipped an empty entry).
  CHECK(run_command(gpt_train() + " sample --run " + out + " --threads 1 -n 1 --ids --prompt-ids '1, 2'").exit_code ==
        0);  // as Python prints a list
  for (const char* ids : {"''", "1,,2", ",", "1,x"}) {
    const auto r = run_command(gpt_train() + " sample --run " + out + " --threads 1 -n 1 --ids --prompt-ids " + ids);
    INFO(ids << ": " << r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("is not a token id; expected comma-separated integers") != std::string::npos);
  }

  // A tokenizer without <|endoftext|>: the inputs are joined, and prepare says so.
  std::string vocab;
  {
    std::ifstream in(bpe + "/vocab.json");
    vocab.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t eot_at = vocab.find(", \"<|endoftext|>\": 856");
  REQUIRE(eot_at != std::string::npos);
  fs::create_directories(dir.file("noeot"));
  dir.write("noeot/vocab.json", vocab.erase(eot_at, std::string(", \"<|endoftext|>\": 856").size()));
  fs::copy_file(bpe + "/merges.txt", dir.file("noeot/merges.txt"));
  const auto joined = run_command(gpt_train() + " prepare -i " + a + " -i " + b + " --tokenizer " + dir.file("noeot") +
                                  " --out " + dir.file("joined"));
  INFO(joined.output);
  CHECK(joined.exit_code == 0);
  CHECK(joined.output.find("no <|endoftext|> token: the inputs are joined without a separator") != std::string::npos);
}

// A model whose vocabulary is padded past its tokenizer's symbols never draws the padding ids when it samples text
// (untrained, its logits are near uniform: 200 draws from all 1024 ids would take some of the 167 past 857).
TEST_CASE("sample draws only the tokenizer's ids when it decodes text", "[apps]") {
  TempDir dir;
  const std::string bpe = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/bpe";
  std::string text;
  for (int i = 0; i < 100; ++i) text += "the cat sat on the mat. a dog ran to the cat.\n";
  REQUIRE(run_command(gpt_train() + " prepare -i " + dir.write("a.txt", text) + " --tokenizer " + bpe + " --out " +
                      dir.file("data"))
              .exit_code == 0);
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(dir.file("data"), out));
  REQUIRE(run_command(gpt_train() + " train --config " + cfg +
                      " --set training.steps=1 --set run.threads=2 --set model.vocab_size=1024")
              .exit_code == 0);
  const auto s = run_command(gpt_train() + " sample --run " + out + " --threads 2 -n 200 --top-k 0 --temperature 2 " +
                             "--prompt 'the' 2>/dev/null");
  CHECK(s.exit_code == 0);
  CHECK(s.output.find("\xEF\xBF\xBD") == std::string::npos);  // U+FFFD: an id with no symbol
  const auto ids = run_command(gpt_train() + " sample --run " + out +
                               " --threads 2 -n 200 --top-k 0 --temperature 2 --ids --prompt 'the' 2>/dev/null");
  std::istringstream in(ids.output);
  int past = 0;
  for (int id = 0; in >> id;) past += id >= 857;
  CHECK(past > 0);  // --ids draws from the model's whole vocabulary, so the text check above could fail
}

// A model trained on shards tokenized elsewhere (no tokenizer.json, as llm.c's GPT-2 BPE shards) samples in token
// ids: --prompt-ids in, --ids out; without them the error says to use them.
TEST_CASE("sample in token ids from a model without a tokenizer", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  std::filesystem::remove(data + "/tokenizer.json");
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(data, out));
  REQUIRE(
      run_command(gpt_train() + " train --config " + cfg + " --set training.steps=3 --set run.threads=2").exit_code ==
      0);
  const std::string sample = gpt_train() + " sample --run " + out + " --threads 2 -n 5";
  const auto text = run_command(sample + " --prompt 'the cat'");
  INFO(text.output);
  CHECK(text.exit_code == 2);
  CHECK(text.output.find("has no tokenizer.json") != std::string::npos);
  CHECK(text.output.find("--prompt-ids") != std::string::npos);
  const auto ids = run_command(sample + " --prompt-ids 1,2,3 --ids 2>/dev/null");
  INFO(ids.output);
  CHECK(ids.exit_code == 0);
  std::istringstream in(ids.output);
  std::vector<int> got;
  for (int id = 0; in >> id;) got.push_back(id);
  REQUIRE(got.size() == 8);  // the prompt's 3 ids, then 5 sampled
  CHECK(std::vector<int>(got.begin(), got.begin() + 3) == std::vector<int>{1, 2, 3});
  for (const int id : got) CHECK((id >= 0 && id < 100));
  const auto outside = run_command(sample + " --prompt-ids 1,100000 --ids");
  CHECK(outside.exit_code == 2);
  CHECK(outside.output.find("--prompt-ids has token 100000, outside the model's vocabulary") != std::string::npos);
}

// Mistakes found by trying the CLI as a user would (each once silent, a crash, or a file replaced).
TEST_CASE("bad input: sample, checkpoint and prepare arguments, and data that does not belong together", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(data, out, "checkpoint:\n  every: 2\n"));
  const std::string train = gpt_train() + " train --config " + cfg + " --set training.steps=2 --set run.threads=1";
  {
    const auto r = run_command(train);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string step2 = out + "/checkpoints/step_00000002";
  SECTION("sample: temperature, top-k and threads in range") {
    const std::string sample = gpt_train() + " sample --run " + out + " --tokens 3 ";
    expect(run_command(sample + "--temperature nan"), 2, {"--temperature must be a finite number > 0"});
    expect(run_command(sample + "--temperature inf"), 2, {"--temperature must be a finite number > 0"});
    expect(run_command(sample + "--top-k -5"), 2, {"--top-k must be >= 0"});
    const auto quiet = run_command("(" + sample + "--top-k -5 2>/dev/null)");  // stdout alone: nothing, not a newline
    CHECK(quiet.exit_code == 2);
    CHECK(quiet.output.empty());
    expect(run_command(sample + "--threads 65536"), 2, {"--threads must be in [0, 4096]"});
    // A temperature so small that logits / temperature overflow is its limit, greedy (it picked the k-th token).
    auto ids = [](const std::string& output) {
      std::istringstream lines(output);
      std::string line, found;
      while (std::getline(lines, line)) {
        if (!line.empty() && line.find_first_not_of("0123456789 ") == std::string::npos) found = line;
      }
      return found;
    };
    const auto greedy =
        run_command(gpt_train() + " sample --run " + out + " --tokens 8 --ids --prompt-ids 1 --top-k 1");
    const auto tiny = run_command(gpt_train() + " sample --run " + out +
                                  " --tokens 8 --ids --prompt-ids 1 --top-k 0 --temperature 1e-45");
    INFO(greedy.output + tiny.output);
    CHECK(greedy.exit_code == 0);
    CHECK(tiny.exit_code == 0);
    CHECK(!ids(greedy.output).empty());
    CHECK(ids(tiny.output) == ids(greedy.output));
    // top-p: so small that only the most likely token is left is greedy; 1 (the default) changes nothing; the
    // nucleus of a flattened distribution leaves out its unlikely tail, so the draws differ from top-k's alone.
    expect(run_command(sample + "--top-p 0"), 2, {"--top-p must be in (0, 1] (1 = off), got 0"});
    expect(run_command(sample + "--top-p 1.5"), 2, {"--top-p must be in (0, 1]"});
    const std::string draw = gpt_train() + " sample --run " + out + " --tokens 40 --ids --prompt-ids 1 ";
    const std::string greedy40 = ids(run_command(draw + "--top-k 1").output);
    CHECK(ids(run_command(draw + "--top-k 0 --temperature 1 --top-p 1e-6").output) == greedy40);
    const auto plain = run_command(draw + "--top-k 0 --temperature 3 --seed 4");
    CHECK(ids(plain.output) != greedy40);
    CHECK(ids(run_command(draw + "--top-k 0 --temperature 3 --seed 4 --top-p 1").output) == ids(plain.output));
    const auto nucleus = run_command(draw + "--top-k 0 --temperature 3 --seed 4 --top-p 0.5");
    CHECK(nucleus.exit_code == 0);
    CHECK(ids(nucleus.output) != ids(plain.output));
  }
  SECTION("a fresh run does not replace another run's checkpoints") {
    const auto r = run_command(train + " --set training.steps=1");
    expect(
        r, 2,
        {out + "/checkpoints already holds the checkpoints of an earlier run (latest step_00000002)", "--resume auto"});
    CHECK(fs::exists(step2 + "/manifest.json"));
    // Its own steps, named relative to the root (the working directory): resumed, not refused.
    expect(run_command("cd " + out + "/checkpoints && " + train + " --set training.steps=3 --resume step_00000002"), 0,
           {"resumed from step_00000002"});
  }
  SECTION("a checkpoint's tokenizer, and train and val shards of different tokenizers") {
    // The same text prepared by byte: ids that mean other tokens.
    const auto p = run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --tokenizer byte --out " +
                               dir.file("bytes"));
    REQUIRE(p.exit_code == 0);
    // A vocabulary of the same size, one symbol other ('c' -> 'b'): the shape matches, the tokens do not.
    std::ifstream in(data + "/tokenizer.json");
    std::string vocab((std::istreambuf_iterator<char>(in)), {});
    const size_t c = vocab.find("\"c\"");
    REQUIRE(c != std::string::npos);
    vocab[c + 1] = 'b';
    const std::string other = dir.write("other.json", vocab);
    expect(run_command(train + " --set training.steps=4 --resume auto --set data.tokenizer=" + other), 2,
           {"is not the tokenizer the shards were prepared with"});
    // Shards without a tokenizer beside them, read with another vocabulary: the checkpoint's tokenizer refuses it.
    fs::create_directories(dir.file("raw"));
    fs::copy_file(data + "/train.bin", dir.file("raw/train.bin"));
    fs::copy_file(data + "/val.bin", dir.file("raw/val.bin"));
    expect(run_command(train + " --set training.steps=4 --resume auto --set data.tokenizer=" + other +
                       " --set data.train=" + dir.file("raw/train.bin") + " --set data.val=" + dir.file("raw/val.bin")),
           2, {"differs from this run's tokenizer", "resume with the data it was trained on"});
    expect(
        run_command(train + " --set run.out_dir=" + dir.file("mixed") + " --set data.val=" + dir.file("bytes/val.bin")),
        2, {"were prepared with different tokenizers", dir.file("bytes/tokenizer.json")});
    CHECK_FALSE(fs::exists(dir.file("mixed")));
  }
  SECTION("sample: a model's tokenizer edited (its checksum), or one with more symbols than the model") {
    const std::string tok = out + "/model/tokenizer.json";
    std::ifstream in(tok);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    const size_t close = text.rfind(']');
    REQUIRE(close != std::string::npos);
    text.insert(close, R"(,"\u00e9","\u00ea")");  // two symbols more than the model was trained with
    std::ofstream(tok, std::ios::trunc) << text;
    const std::string sample = gpt_train() + " sample --run " + out + " --tokens 3";
    expect(run_command(sample), 2, {tok + ": checksum mismatch"});
    // A manifest of before the checksums: the symbols are counted against the model's vocabulary instead.
    std::ifstream min(out + "/model/manifest.json");
    std::string m((std::istreambuf_iterator<char>(min)), {});
    const size_t at = m.find(",\n  \"tokenizer_crc32c\"");
    REQUIRE(at != std::string::npos);
    m.erase(at, m.find(',', at + 1) - at);  // the field and the comma before it
    std::ofstream(out + "/model/manifest.json", std::ios::trunc) << m;
    expect(run_command(sample), 2, {tok + ": ", "symbols, more than the model's vocabulary of", "not the tokenizer"});
  }
  SECTION("a manifest whose numbers are out of range is corrupt") {
    std::ifstream in(step2 + "/manifest.json");
    std::string m((std::istreambuf_iterator<char>(in)), {});
    const size_t at = m.find("\"step\": 2");
    REQUIRE(at != std::string::npos);
    m.replace(at, 9, "\"step\": -5");
    std::ofstream(step2 + "/manifest.json", std::ios::trunc) << m;
    expect(run_command(gpt_train() + " checkpoint verify " + step2), 2, {"\"step\" -5", "is negative"});
  }
  SECTION("consolidate: an empty --out, or one that is not a regular file") {
    expect(run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out ''"), 2, {"--out is empty"});
    const std::string fifo = dir.file("pipe");
    REQUIRE(run_command("mkfifo " + fifo).exit_code == 0);
    expect(run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " + fifo), 2,
           {fifo + ": is a pipe"});
    CHECK(fs::is_fifo(fifo));
    // A symbolic link is written through: the link stays, its file gets the weights.
    const std::string target = dir.write("target.safetensors", "old");
    fs::create_symlink(target, dir.file("link.safetensors"));
    expect(run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " + dir.file("link.safetensors")),
           0, {});
    CHECK(fs::is_symlink(dir.file("link.safetensors")));
    CHECK(fs::file_size(target) > 1000);
    // A link to a file not there yet makes that file, as a plain write would.
    fs::create_symlink("made.safetensors", dir.file("dangling.safetensors"));
    expect(run_command(gpt_train() + " checkpoint consolidate " + out + "/model --out " +
                       dir.file("dangling.safetensors")),
           0, {});
    CHECK(fs::is_symlink(dir.file("dangling.safetensors")));
    CHECK(fs::file_size(dir.file("made.safetensors")) > 1000);
  }
  SECTION("checkpoint subcommands show their own examples") {
    for (const char* sub : {"inspect", "verify", "consolidate", "import"}) {
      const auto h = run_command(gpt_train() + " checkpoint " + sub + " --help");
      expect(h, 0, {std::string("gpt-train checkpoint ") + sub});
      CHECK(h.output.find("gpt-train prepare") == std::string::npos);
    }
  }
  SECTION("plan: a memory that is not a number, a vocabulary past uint16") {
    const std::string plan = gpt_train() + " plan -c " + cfg + " -n 1 ";
    expect(run_command(plan + "--device-memory-gb nan"), 2, {"expected a finite number > 0"});
    expect(run_command(plan + "--vocab-size 1000000"), 2, {"--vocab-size"});
    expect(run_command(gpt_train() + " plan -c " + cfg + " -n 0"), 2, {"--world-size", "not in range 1 to 16777216"});
  }
  SECTION("prepare: a split left empty") {
    expect(run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --val-fraction 0.99999 --out " +
                       dir.file("empty")),
           2, {"leaves the train split empty; nothing written"});
    CHECK_FALSE(fs::exists(dir.file("empty")));
  }
  SECTION("prepare: bytes that are not UTF-8 in the second input, named with their offset in it") {
    const std::string bad = dir.write("latin1.txt", "caf\xe9 au lait\n");
    expect(run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --input " + bad + " --out " +
                       dir.file("mixed")),
           2, {"prepare: " + bad + ": invalid UTF-8 at byte offset 3", "--tokenizer byte"});
    CHECK_FALSE(fs::exists(dir.file("mixed")));
    expect(run_command(gpt_train() + " prepare --input " + bad + " --out " + dir.file("corpus.txt")), 2,
           {"--tokenizer byte"});  // the input is checked first
    // A character cut in two between inputs (as split -b cuts them) is whole in the text they make.
    const std::string first = dir.write("part1.txt", "caf\xc3"), second = dir.write("part2.txt", "\xa9 au lait\n");
    expect(run_command(gpt_train() + " prepare --input " + first + " --input " + second + " --val-fraction 0 --out " +
                       dir.file("parts")),
           0, {});
    expect(run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --out " + dir.file("corpus.txt")),
           2, {"--out " + dir.file("corpus.txt") + " is a file; expected a directory"});
  }
  SECTION("resume: a changed dropout is said in the log, and an error names --resume as given") {
    expect(run_command(train + " --set training.steps=3 --resume auto --set model.dropout=0.25"), 0,
           {"--set model.dropout=0.25: model.dropout is '0.250000' where the checkpoint's run had '0.000000'"});
    expect(run_command(train + " --set training.steps=3 --resume " + dir.file("nope")), 2,
           {"--resume " + dir.file("nope")});
  }
  SECTION("hybrid with one shard group says what it runs as") {
    expect(run_command(train + " --set parallel.strategy=hybrid --set run.out_dir=" + dir.file("hybrid")), 0,
           {"parallel.strategy hybrid with one shard group of all 1 rank(s) runs as plain zero3"});
  }
  SECTION("checkpoint import: a path that does not exist is named") {
    expect(run_command(gpt_train() + " checkpoint import " + dir.file("nope") + " --out " + dir.file("imported")), 2,
           {dir.file("nope") + ": no such file or directory"});
  }
}

// Without a validation split: prepare --val-fraction 0 writes no val.bin (and removes an earlier one, which would be
// read with the new tokenizer), and a run with data.val "" trains, saves and resumes with no evaluations.
TEST_CASE("a run without a validation split: prepare --val-fraction 0 and data.val \"\"", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  REQUIRE(fs::exists(data + "/val.bin"));
  expect(run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --val-fraction 0 --out " + data), 0,
         {"--val-fraction 0: no val.bin (the earlier " + data + "/val.bin was removed)", "data.val: \"\"",
          "0 val tokens"});
  CHECK_FALSE(fs::exists(data + "/val.bin"));
  // A directory in val.bin's place stops it before anything is written.
  fs::create_directories(dir.file("blocked/val.bin/sub"));
  expect(run_command(gpt_train() + " prepare --input " + dir.file("corpus.txt") + " --val-fraction 0 --out " +
                     dir.file("blocked")),
         2, {dir.file("blocked/val.bin") + " is a directory; nothing written"});
  CHECK_FALSE(fs::exists(dir.file("blocked/train.bin")));
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(data, out, "checkpoint:\n  every: 4\n"));
  const std::string train = gpt_train() + " train --config " + cfg + " --set run.threads=2 --set training.steps=4 ";
  // As the config stands, data.val names the file that is gone.
  expect(run_command(train), 2, {"data.val", data + "/val.bin", "data.val: \"\" trains without a validation split"});
  expect(run_command(train + "--set data.val=''"), 0,
         {"data.val is empty: this run has no validation split, so no evaluations and no val loss"});
  const std::string metrics = read_text(out + "/metrics.jsonl");
  CHECK(std::count(metrics.begin(), metrics.end(), '\n') == 4);
  CHECK(metrics.find("val_loss") == std::string::npos);
  CHECK(read_text(out + "/summary.json").find("\"final_val_loss\": null") != std::string::npos);
  expect(run_command(train + "--set data.val='' --set training.steps=6 --resume auto"), 0, {"done: 6 steps"});
  expect(run_command(gpt_train() + " sample --run " + out + " --prompt 'the ' --tokens 5 --seed 1"), 0, {"the "});
}

// A finished run submitted again with --resume auto (a job requeued as it ended) trains nothing and leaves its
// summary, metrics and model as they were, exit 0.
TEST_CASE("resume auto of a finished run leaves it as it is", "[apps]") {
  TempDir dir;
  const std::string data = prepare_corpus(dir);
  const std::string out = dir.file("run");
  const std::string cfg = dir.write("run.yaml", tiny_config(data, out, "checkpoint:\n  every: 10\n"));
  const std::string train = gpt_train() + " train --config " + cfg + " --set training.steps=10 --set run.threads=2";
  REQUIRE(run_command(train).exit_code == 0);
  auto read = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string summary = read(out + "/summary.json"), metrics = read(out + "/metrics.jsonl");
  const auto model_time = std::filesystem::last_write_time(out + "/model");
  REQUIRE(summary.find("\"steps_done\": 10") != std::string::npos);
  const auto again = run_command(train + " --resume auto");
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("the run is complete: resumed at step 10 of training.steps 10, nothing to train") !=
        std::string::npos);
  CHECK(read(out + "/summary.json") == summary);
  CHECK(read(out + "/metrics.jsonl") == metrics);
  CHECK(std::filesystem::last_write_time(out + "/model") == model_time);
  // Stopped after its last checkpoint but before its final model and summary (killed while saving): resuming
  // takes no step but writes them.
  std::filesystem::remove_all(out + "/model");
  std::filesystem::remove(out + "/summary.json");
  const auto finish = run_command(train + " --resume auto");
  INFO(finish.output);
  CHECK(finish.exit_code == 0);
  CHECK(finish.output.find("the run is complete") == std::string::npos);
  CHECK(std::filesystem::exists(out + "/model/manifest.json"));
  CHECK(read(out + "/summary.json").find("\"steps_done\": 10") != std::string::npos);
}

// The built-in quickstart config's error points at scripts/setup.sh only when its data is what is missing.
TEST_CASE("bad input: the built-in config without its data, or asked for what it cannot do", "[apps]") {
  TempDir dir;  // no data/fortunes here
  const std::string in_dir = "cd " + dir.file("") + " && " + gpt_train() + " train";
  const auto missing = run_command(in_dir + " --set training.steps=1");
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK(missing.output.find("data/fortunes, which scripts/setup.sh prepares") != std::string::npos);
  // With its data there (the tiny corpus, where the quickstart looks), an error of another kind at the start
  // (a checkpoint that is not there) is not blamed on missing data.
  const std::string data = prepare_corpus(dir);
  std::filesystem::rename(data, dir.file("fortunes"));
  std::filesystem::create_directories(dir.file("data"));
  std::filesystem::rename(dir.file("fortunes"), dir.file("data/fortunes"));
  const auto other = run_command(in_dir + " --set training.steps=1 --resume " + dir.file("no_such_checkpoint"));
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK(other.output.find("no_such_checkpoint") != std::string::npos);
  CHECK(other.output.find("setup.sh") == std::string::npos);
}

TEST_CASE("help, version and the config reference", "[apps]") {
  const auto v = run_command(gpt_train() + " --version");
  REQUIRE(v.exit_code == 0);
  REQUIRE(v.output.find("gpt-train ") != std::string::npos);
  // What was built: the CUDA backend with its architectures, or CPU only.
#ifdef GPT_WITH_CUDA
  CHECK(v.output.find("(CPU and CUDA ") != std::string::npos);
  CHECK(v.output.find("architectures ") != std::string::npos);
#else
  CHECK(v.output.find("(CPU only") != std::string::npos);
#endif
  for (const char* sub : {"train", "prepare", "sample"}) {
    const auto h = run_command(gpt_train() + " " + sub + " --help");
    REQUIRE(h.exit_code == 0);
    REQUIRE(h.output.find("Examples:") != std::string::npos);
  }
  const auto c = run_command(gpt_train() + " train --help-config");
  REQUIRE(c.exit_code == 0);
  REQUIRE(c.output.find("model:") != std::string::npos);
  REQUIRE(c.output.find("n_head = 4") != std::string::npos);
  REQUIRE(c.output.find("activation_checkpointing = \"none\"") != std::string::npos);
}

}  // namespace
}  // namespace gpt
