#include "checkpoint/model_file.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/crc32c.h"
#include "core/atomic_file.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

constexpr int kVersion = 1;
constexpr const char* kShardFile = "shard_00000.bin";

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string manifest_json(const GptShape& s, int64_t step, const ModelLayout& layout, uint32_t crc,
                          bool has_tokenizer) {
  std::ostringstream o;
  o << "{\n  \"format\": \"gpt-train checkpoint\",\n  \"version\": " << kVersion << ",\n  \"step\": " << step
    << ",\n  \"model\": {\"n_layer\": " << s.n_layer << ", \"n_head\": " << s.n_head << ", \"n_embd\": " << s.n_embd
    << ", \"block_size\": " << s.block_size << ", \"vocab_size\": " << s.vocab_size << ", \"dropout\": " << s.dropout
    << ", \"tied_embeddings\": true},\n  \"dtype\": \"f32\",\n  \"units\": [\n";
  int64_t base = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const auto& unit = layout.units[u];
    o << "    {\"name\": \"" << unit.name << "\", \"offset\": " << base << ", \"numel\": " << unit.numel
      << ", \"params\": [";
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const auto& p = unit.params[i];
      o << (i ? ", " : "") << "{\"name\": \"" << p.name << "\", \"shape\": [";
      for (size_t d = 0; d < p.shape.size(); ++d) o << (d ? ", " : "") << p.shape[d];
      o << "], \"offset\": " << p.offset << ", \"numel\": " << p.numel << "}";
    }
    o << "]}" << (u + 1 < layout.units.size() ? "," : "") << "\n";
    base += unit.numel;
  }
  o << "  ],\n  \"shards\": [{\"file\": \"" << kShardFile << "\", \"rank\": 0, \"begin\": 0, \"end\": " << base
    << ", \"bytes\": " << base * 4 << ", \"crc32c\": \"" << hex32(crc) << "\"}],\n  \"tokenizer\": "
    << (has_tokenizer ? "\"tokenizer.json\"" : "null") << "\n}\n";
  return o.str();
}

}  // namespace

Status save_model(const std::string& dir, const GptShape& shape, const float* weights, int64_t step,
                  const std::string& tokenizer_json) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::io_error("cannot create directory '" + dir + "': " + ec.message());
  const ModelLayout layout = ModelLayout::build(shape);
  const size_t bytes = static_cast<size_t>(layout.total_numel) * sizeof(float);
  const uint32_t crc = crc32c(weights, bytes);
  GPT_RETURN_IF_ERROR(write_file_atomically(
      (fs::path(dir) / kShardFile).string(), {std::span<const char>(reinterpret_cast<const char*>(weights), bytes)}));
  if (!tokenizer_json.empty()) {
    GPT_RETURN_IF_ERROR(write_file_atomically((fs::path(dir) / "tokenizer.json").string(),
                                                    {std::span<const char>(tokenizer_json)}));
  }
  const std::string manifest = manifest_json(shape, step, layout, crc, !tokenizer_json.empty());
  return write_file_atomically((fs::path(dir) / "manifest.json").string(), {std::span<const char>(manifest)});
}

Expected<SavedModel> load_model(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  std::string text;
  Status st = read_file(mpath, &text);
  if (!st.is_ok()) {
    return Status::not_found("'" + dir + "' is not a gpt-train model directory: " + st.message());
  }
  SavedModel out;
  try {
    const YAML::Node m = YAML::Load(text);
    if (m["format"].as<std::string>("") != "gpt-train checkpoint") {
      return Status::corruption(mpath + ": not a gpt-train checkpoint manifest");
    }
    const int version = m["version"].as<int>(0);
    if (version != kVersion) {
      return Status::failed_precondition(mpath + ": manifest version " + std::to_string(version) +
                                         ", this build reads version " + std::to_string(kVersion));
    }
    const YAML::Node model = m["model"];
    out.shape.n_layer = model["n_layer"].as<int>();
    out.shape.n_head = model["n_head"].as<int>();
    out.shape.n_embd = model["n_embd"].as<int>();
    out.shape.block_size = model["block_size"].as<int>();
    out.shape.vocab_size = model["vocab_size"].as<int>();
    out.shape.dropout = model["dropout"].as<float>(0.0f);
    out.step = m["step"].as<int64_t>(0);
    if (out.shape.n_layer < 1 || out.shape.n_head < 1 || out.shape.n_embd < 1 ||
        out.shape.n_embd % out.shape.n_head != 0 || out.shape.block_size < 1 || out.shape.vocab_size < 1) {
      return Status::corruption(mpath + ": impossible model shape");
    }
    const ModelLayout layout = ModelLayout::build(out.shape);
    const YAML::Node units = m["units"];
    if (!units.IsSequence() || units.size() != layout.units.size()) {
      return Status::corruption(mpath + ": unit list does not match the model shape");
    }
    for (size_t u = 0; u < layout.units.size(); ++u) {
      if (units[u]["name"].as<std::string>() != layout.units[u].name ||
          units[u]["numel"].as<int64_t>() != layout.units[u].numel) {
        return Status::corruption(mpath + ": unit " + std::to_string(u) + " ('" +
                                  units[u]["name"].as<std::string>() + "') does not match the layout of this shape");
      }
    }
    const YAML::Node shard = m["shards"][0];
    const std::string spath = (fs::path(dir) / shard["file"].as<std::string>()).string();
    const uint32_t want_crc = static_cast<uint32_t>(std::stoul(shard["crc32c"].as<std::string>(), nullptr, 16));
    std::string bytes;
    GPT_RETURN_IF_ERROR(read_file(spath, &bytes));
    const size_t want = static_cast<size_t>(layout.total_numel) * sizeof(float);
    if (bytes.size() != want) {
      return Status::corruption(spath + ": " + std::to_string(bytes.size()) + " bytes, the manifest's layout needs " +
                                std::to_string(want));
    }
    const uint32_t crc = crc32c(bytes.data(), bytes.size());
    if (crc != want_crc) {
      return Status::corruption(spath + ": checksum mismatch (crc32c " + hex32(crc) + ", manifest says " +
                                hex32(want_crc) + ")");
    }
    out.weights.resize(layout.total_numel);
    std::memcpy(out.weights.data(), bytes.data(), want);
    if (m["tokenizer"] && m["tokenizer"].IsScalar()) {
      out.tokenizer_path = (fs::path(dir) / m["tokenizer"].as<std::string>()).string();
    }
  } catch (const YAML::Exception& e) {
    return Status::corruption(mpath + ": malformed manifest: " + e.what());
  } catch (const std::exception& e) {
    return Status::corruption(mpath + ": malformed manifest: " + e.what());
  }
  return out;
}

}  // namespace gpt
