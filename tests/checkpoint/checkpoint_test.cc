// The checkpoint writer and reader on one process: round trips of arbitrary slicings, reads of any range,
// retention and `latest`, leftovers of a crashed save, and every kind of damage giving an error that names
// the file and the problem.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/model_file.h"
#include "comm/communicator.h"
#include "testing/temp_dir.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;

GptShape tiny_shape() {
  GptShape s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.block_size = 8;
  s.vocab_size = 11;
  return s;
}

// A checkpoint of `shape` whose three sections hold distinct known values, stored as `parts` slices per unit
// (as if `parts` ranks had each written one), all in one call on one process.
struct Fixture {
  GptShape shape = tiny_shape();
  ModelLayout layout = ModelLayout::build(shape);
  std::vector<float> master, m, v;  // full flat buffers
  Fixture() {
    master.resize(layout.total_numel);
    std::iota(master.begin(), master.end(), 0.0f);
    m = master;
    v = master;
    for (float& x : m) x = -x;
    for (float& x : v) x = x * 0.5f + 1000.0f;
  }
  SaveRequest request(int64_t step, int parts) const {
    SaveRequest req;
    req.manifest.step = step;
    req.manifest.shape = shape;
    req.manifest.sections = {"master", "adam_m", "adam_v"};
    req.manifest.strategy = "zero3";
    req.manifest.world_size = parts;
    req.manifest.shard_group_size = parts;
    // What a trainer records (the reader holds these to their ranges).
    req.manifest.global_batch = 12;
    req.manifest.adam_steps = step;
    req.manifest.beta1 = 0.9f;
    req.manifest.beta2 = 0.95f;
    req.manifest.eps = 1e-8f;
    req.manifest.weight_decay = 0.1f;
    req.sections = {master.data(), m.data(), v.data()};
    int64_t offset = 0;
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const int64_t n = layout.units[u].numel, per = (n + parts - 1) / parts;
      for (int p = 0; p < parts; ++p) {
        const int64_t b = std::min(n, p * per), e = std::min(n, b + per);
        if (e > b) req.slices.push_back({static_cast<int>(u), b, e - b, offset + b});
      }
      offset += n;
    }
    return req;
  }
};

void flip_byte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(at);
  f.write(&c, 1);
}

TEST_CASE("CRC-32C: the standard check value, and running checksums over pieces", "[checkpoint]") {
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);  // RFC 3720's CRC-32C check value
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (size_t cut : {0, 1, 7, 8, 9, 500, 999}) {
    CHECK(crc32c(bytes.data() + cut, bytes.size() - cut, crc32c(bytes.data(), cut)) == whole);
  }
}

TEST_CASE("A checkpoint reads back any element range of any section", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  auto one = make_single_communicator();
  SaveRequest req = fx.request(7, 1);
  REQUIRE(save_checkpoint(*one, tmp.file("ck"), step_dir_name(7), req).is_ok());
  auto reader = CheckpointReader::open(tmp.file("ck/step_00000007"));
  REQUIRE(reader.has_value());
  CHECK(reader->manifest().step == 7);
  CHECK(reader->manifest().strategy == "zero3");
  {
    std::ifstream in(tmp.file("ck/step_00000007/manifest.json"));
    const std::string text(std::istreambuf_iterator<char>(in), {});
    CHECK(text.find(R"({"name": "attn.qkv.weight", "shape": [24, 8], "dtype": "f32", "offset": 16)") !=
          std::string::npos);
  }
  REQUIRE(reader->verify().is_ok());
  int64_t offset = 0;
  std::mt19937 rng(3);
  for (size_t u = 0; u < fx.layout.units.size(); ++u) {
    const int64_t n = fx.layout.units[u].numel;
    for (int trial = 0; trial < 5; ++trial) {
      const int64_t b = static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
      const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(n - b));
      for (const auto& [name, full] :
           {std::pair{"master", &fx.master}, std::pair{"adam_m", &fx.m}, std::pair{"adam_v", &fx.v}}) {
        std::vector<float> got(static_cast<size_t>(len));
        REQUIRE(reader->read(name, static_cast<int>(u), b, len, got.data()).is_ok());
        REQUIRE(std::equal(got.begin(), got.end(), full->begin() + offset + b));
      }
    }
    offset += n;
  }
  CHECK(latest_checkpoint(tmp.file("ck")) == tmp.file("ck/step_00000007"));
}

TEST_CASE("Reading a range reads only the slices that hold it", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  // Four "ranks": four files, each one quarter of every unit, written as FORMAT.md describes.
  SaveRequest all = fx.request(1, 4);
  Manifest merged = all.manifest;
  fs::create_directories(tmp.file("four"));
  for (int p = 0; p < 4; ++p) {
    ShardFile f;
    f.file = "shard_0000" + std::to_string(p) + ".bin";
    f.rank = p;
    std::string bytes;
    for (const float* section : all.sections) {
      for (size_t i = static_cast<size_t>(p); i < all.slices.size(); i += 4) {
        const SaveSlice& s = all.slices[i];
        const char* data = reinterpret_cast<const char*>(section + s.local_offset);
        bytes.append(data, static_cast<size_t>(s.length) * 4);
        if (section == all.sections[0]) f.slices.push_back({s.unit, s.begin, s.length, {}});
        f.slices[(i - static_cast<size_t>(p)) / 4].crc.push_back(crc32c(data, static_cast<size_t>(s.length) * 4));
      }
    }
    std::ofstream(tmp.file("four/" + f.file), std::ios::binary) << bytes;
    merged.shards.push_back(f);
  }
  std::ofstream(tmp.file("four/manifest.json")) << manifest_to_json(merged);
  auto reader = CheckpointReader::open(tmp.file("four"));
  INFO(reader.status().message());
  REQUIRE(reader.has_value());
  REQUIRE(reader->verify().is_ok());
  const int64_t before = reader->bytes_read();
  const int unit = 1;
  const int64_t n = fx.layout.units[unit].numel, quarter = (n + 3) / 4;
  std::vector<float> got(static_cast<size_t>(quarter));
  REQUIRE(reader->read("adam_v", unit, quarter, quarter, got.data()).is_ok());  // exactly rank 1's slice
  CHECK(reader->bytes_read() - before == quarter * 4);
  const int64_t base = fx.layout.units[0].numel;
  REQUIRE(std::equal(got.begin(), got.end(), fx.v.begin() + base + quarter));
}

TEST_CASE("keep_last prunes the oldest step directories and a crashed save's leftovers", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  auto one = make_single_communicator();
  fs::create_directories(tmp.file("ck/.tmp-step_00000099"));  // a save that crashed halfway
  for (int64_t step : {1, 2, 3, 4}) {
    SaveRequest req = fx.request(step, 1);
    req.keep_last = 2;
    REQUIRE(save_checkpoint(*one, tmp.file("ck"), step_dir_name(step), req).is_ok());
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp.file("ck"))) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"latest", "step_00000003", "step_00000004"});
  CHECK(latest_checkpoint(tmp.file("ck")) == tmp.file("ck/step_00000004"));
  // Without `latest` (a crash right after the rename), the newest complete step directory.
  fs::remove(tmp.file("ck/latest"));
  fs::create_directories(tmp.file("ck/step_00000009"));  // no manifest: not a checkpoint
  CHECK(latest_checkpoint(tmp.file("ck")) == tmp.file("ck/step_00000004"));
  CHECK(latest_checkpoint(tmp.file("nothing_here")).empty());
}

TEST_CASE("Saving step N removes stale later steps and prunes by step number", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  auto one = make_single_communicator();
  auto save = [&](int64_t step, int keep_last) {
    SaveRequest req = fx.request(step, 1);
    req.keep_last = keep_last;
    REQUIRE(save_checkpoint(*one, tmp.file("ck"), step_dir_name(step), req).is_ok());
  };
  auto names = [&] {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(tmp.file("ck"))) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  for (int64_t step : {2, 4, 6, 8}) save(step, 0);
  // Resumed from step 6: its step 7 makes step 8 (of the abandoned run) stale.
  save(7, 0);
  CHECK(names() ==
        std::vector<std::string>{"latest", "step_00000002", "step_00000004", "step_00000006", "step_00000007"});
  // Steps past eight digits sort by number, not by name.
  save(99999999, 0);
  save(100000000, 2);
  CHECK(names() == std::vector<std::string>{"latest", "step_100000000", "step_99999999"});
  fs::remove(tmp.file("ck/latest"));
  CHECK(latest_checkpoint(tmp.file("ck")) == tmp.file("ck/step_100000000"));
}

TEST_CASE("Damaged checkpoints give errors naming the file and the problem", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  auto one = make_single_communicator();
  const std::string dir = tmp.file("ck/step_00000005");
  auto fresh = [&] {
    fs::remove_all(tmp.file("ck"));
    REQUIRE(save_checkpoint(*one, tmp.file("ck"), "step_00000005", fx.request(5, 1)).is_ok());
  };
  auto error_of = [&]() -> std::string {
    auto r = CheckpointReader::open(dir);
    if (!r) return r.status().message();
    Status st = r->verify();
    return st.is_ok() ? "" : st.message();
  };
  const std::string shard = dir + "/shard_00000.bin";
  SECTION("intact") {
    fresh();
    CHECK(error_of().empty());
  }
  SECTION("a flipped byte") {
    fresh();
    flip_byte(shard, 4 * 100 + 1);
    const std::string e = error_of();
    CHECK(e.find(shard) != std::string::npos);
    CHECK(e.find("checksum mismatch in section master of unit 'embed'") != std::string::npos);
    // The slices before and after the damage still read.
    auto r = CheckpointReader::open(dir);
    std::vector<float> x(4);
    CHECK(r->read("master", 1, 0, 4, x.data()).is_ok());
    CHECK(!r->read("master", 0, 0, 4, x.data()).is_ok());
  }
  SECTION("a truncated shard") {
    fresh();
    fs::resize_file(shard, fs::file_size(shard) - 3);
    const std::string e = error_of();
    CHECK(e.find(shard) != std::string::npos);
    CHECK(e.find("(truncated)") != std::string::npos);
  }
  SECTION("a missing shard") {
    fresh();
    fs::remove(shard);
    CHECK(error_of().find(shard + ": shard file missing") != std::string::npos);
  }
  SECTION("a manifest of another version") {
    fresh();
    std::ifstream in(dir + "/manifest.json");
    std::string text(std::istreambuf_iterator<char>(in), {});
    text.replace(text.find("\"version\": 2"), 12, "\"version\": 9");
    std::ofstream(dir + "/manifest.json") << text;
    CHECK(error_of().find("manifest.json: manifest version 9; this build reads versions 1 and 2") != std::string::npos);
  }
  // Hand edits of the manifest's text: each names the field and what it should be, and `verify` never passes.
  auto edited = [&](const std::string& from, const std::string& to) {
    fresh();
    std::ifstream in(dir + "/manifest.json");
    std::string text(std::istreambuf_iterator<char>(in), {});
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    std::ofstream(dir + "/manifest.json") << text;
    return error_of();
  };
  SECTION("a manifest field that is not a number, or not an integer") {
    CHECK(edited("\"step\": 5", "\"step\": \"four\"").find("\"step\" is the string \"four\", expected an integer") !=
          std::string::npos);
    CHECK(edited("\"step\": 5", "\"step\": 1e30").find("\"step\" is 1e30, expected an integer") != std::string::npos);
    CHECK(
        edited("\"tokens_seen\": ", "\"tokens_seen\": \"x\", \"was\": ").find("\"tokens_seen\" is the string \"x\"") !=
        std::string::npos);
    CHECK(edited("\"tokens_seen\": ", "\"no_tokens\": ").find("\"tokens_seen\" is missing") != std::string::npos);
    CHECK(edited("\"step\": 5", "\"step\": null").find("\"step\" is null, expected an integer") != std::string::npos);
    // A list entry's field is named with its index.
    CHECK(edited("\"rank\": 0", "\"rank\": \"zero\"").find("\"shards[0].rank\" is the string \"zero\"") !=
          std::string::npos);
    CHECK(edited("\"begin\": 0", "\"begin\": null").find("\"shards[0].slices[0].begin\" is null") != std::string::npos);
    CHECK(edited("\"numel\": ", "\"numel\": \"x\", \"was\": ").find("\"units[0].numel\" is the string \"x\"") !=
          std::string::npos);
  }
  SECTION("a manifest of an impossible shape names the field") {
    CHECK(edited("\"n_head\": 2", "\"n_head\": 3")
              .find("impossible model shape: \"model.n_head\" is 3, expected a divisor of model.n_embd 8") !=
          std::string::npos);
  }
  SECTION("a manifest whose unit or parameter description disagrees with the layout") {
    CHECK(edited("\"offset\": 0, \"numel\"", "\"offset\": -5, \"numel\"")
              .find("unit 0 ('embed') does not match the layout of this model shape: expected \"offset\" 0") !=
          std::string::npos);
    CHECK(edited("\"shape\": [24, 8]", "\"shape\": [8, 24]").find("param 2 should be 'attn.qkv.weight'") !=
          std::string::npos);
  }
  SECTION("a manifest whose shards' ranks repeat or lie outside the saving world") {
    CHECK(edited("\"rank\": 0", "\"rank\": 1").find("has \"rank\" 1, expected in [0, parallel.world_size 1)") !=
          std::string::npos);
  }
  SECTION("an edited tokenizer or config: their checksums are in the manifest") {
    for (const char* name : {"tokenizer.json", "config.yaml"}) {
      fs::remove_all(tmp.file("ck"));
      SaveRequest req = fx.request(5, 1);
      req.tokenizer_json = R"({"type":"char","vocab":["a","b","c"]})";
      req.config_yaml = "model:\n  n_layer: 2\n";
      REQUIRE(save_checkpoint(*one, tmp.file("ck"), "step_00000005", req).is_ok());
      REQUIRE(error_of().empty());
      {
        std::ifstream in(dir + "/" + name);
        std::string text(std::istreambuf_iterator<char>(in), {});
        text[text.size() / 2] ^= 1;
        std::ofstream(dir + "/" + name) << text;
      }
      INFO(name);
      CHECK(error_of().find(dir + "/" + name + ": checksum mismatch") != std::string::npos);
    }
  }
  SECTION("a manifest naming a file outside the directory") {
    fresh();
    Manifest m = CheckpointReader::open(dir)->manifest();
    m.tokenizer = "../../etc/passwd";
    std::ofstream(dir + "/manifest.json") << manifest_to_json(m);
    CHECK(error_of().find("\"tokenizer\" must be a plain file name, got '../../etc/passwd'") != std::string::npos);
  }
  SECTION("a manifest listing a slice twice") {
    fresh();
    Manifest m = CheckpointReader::open(dir)->manifest();
    m.shards.push_back(m.shards[0]);  // as from a second rank
    m.shards.back().rank = 1;
    m.world_size = 2;
    std::ofstream(dir + "/manifest.json") << manifest_to_json(m);
    CHECK(error_of().find("do not cover unit 'embed' exactly once") != std::string::npos);
    m.shards.back().rank = 0;  // or a second shard of the same rank
    std::ofstream(dir + "/manifest.json") << manifest_to_json(m);
    CHECK(error_of().find("has \"rank\" 0, which another shard has too") != std::string::npos);
  }
  SECTION("no manifest: a save that never finished") {
    fresh();
    fs::remove(dir + "/manifest.json");
    CHECK(error_of().find("is not a complete gpt-train checkpoint") != std::string::npos);
  }
  SECTION("a manifest whose slices leave a gap") {
    fresh();
    Manifest m = CheckpointReader::open(dir)->manifest();
    m.shards[0].slices.back().begin += 1;  // the head unit's first element is stored nowhere
    m.shards[0].slices.back().length -= 1;
    std::ofstream(dir + "/manifest.json") << manifest_to_json(m);
    CHECK(error_of().find("do not cover unit 'head'") != std::string::npos);
  }
}

TEST_CASE("Model directories of version 1 and 2 load the same weights", "[checkpoint]") {
  testing::TempDir tmp;
  Fixture fx;
  REQUIRE(save_model(tmp.file("m"), fx.shape, fx.master.data(), 3, "").is_ok());
  auto model = load_model(tmp.file("m"));
  REQUIRE(model.has_value());
  CHECK(model->step == 3);
  CHECK(model->weights == fx.master);
  // A checkpoint directory is also a model: its master section.
  auto one = make_single_communicator();
  REQUIRE(save_checkpoint(*one, tmp.file("ck"), "step_00000003", fx.request(3, 1)).is_ok());
  auto from_ck = load_model(tmp.file("ck/step_00000003"));
  REQUIRE(from_ck.has_value());
  CHECK(from_ck->weights == fx.master);
  // The version-1 fixture of the reference test.
  auto v1 = load_model(std::string(GPT_SOURCE_DIR) + "/tests/fixtures/reference");
  INFO(v1.status().message());
  CHECK(v1.has_value());
}

}  // namespace
}  // namespace gpt
