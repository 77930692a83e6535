#include "checkpoint/manifest.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "checkpoint/json_text.h"
#include "core/json.h"

namespace gpt {

namespace {

// A place in the parsed manifest: a value, or none (a field that is absent, an index past a list's end). Indexing
// none, or a key of what is not an object, gives none; the size of what is not a list is 0.
struct Node {
  const json::Value* v = nullptr;
  explicit operator bool() const { return v != nullptr; }
  Node operator[](const char* key) const { return {v != nullptr && v->is_object() ? v->find(key) : nullptr}; }
  Node operator[](size_t i) const { return {v != nullptr && v->is_array() && i < v->size() ? &v->item(i) : nullptr}; }
  size_t size() const { return v != nullptr && v->is_array() ? v->size() : 0; }
  bool is_list() const { return v != nullptr && v->is_array(); }
  // The value as a message shows it: a string as the string "...", a number or a literal as written, else its kind.
  std::string shown() const {
    if (v == nullptr) return "missing";
    if (v->is_string()) return "the string \"" + v->text() + "\"";
    if (v->is_number()) return v->text();
    if (v->is_bool()) return v->boolean() ? "true" : "false";
    return json::type_name(v->type());
  }
};

// "0x" and up to 8 hex digits (hex32's form); anything else throws, naming the field (the caller reports a malformed
// manifest).
uint32_t parse_crc(const Node& n, const char* key = "crc32c") {
  const std::string text = n && n.v->is_string() ? n.v->text() : std::string();
  const std::string digits = text.starts_with("0x") ? text.substr(2) : text;
  const bool hex =
      !digits.empty() && digits.size() <= 8 && digits.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (!hex) throw std::runtime_error(std::string("\"") + key + "\" is " + n.shown() + ", expected a 32-bit hex string");
  return static_cast<uint32_t>(std::stoul(digits, nullptr, 16));
}

// The value of field `key` (its dotted name, for the message) as a T. A field that is there but not a T (a number
// written as a string, a float where an integer belongs, one out of T's range) throws, naming the field; a missing
// one throws too, unless `absent` gives its value (a field older manifests lack).
template <typename T>
T get(const Node& n, const std::string& key, std::optional<T> absent = std::nullopt) {
  if (!n) {
    if (absent) return *absent;
    throw std::runtime_error("\"" + key + "\" is missing");
  }
  std::string kind = "a string";
  if constexpr (std::is_floating_point_v<T>) {
    kind = "a number in float range";
  } else if constexpr (std::is_integral_v<T>) {
    kind = std::string("an integer of ") + (std::is_signed_v<T> ? "int" : "uint") + std::to_string(8 * sizeof(T));
  } else if constexpr (!std::is_same_v<T, std::string>) {
    kind = "a list of integers";
  }
  // null is there but no value; the writer writes null only for the fields read by name elsewhere (tokenizer, config).
  if (n.v->is_null()) throw std::runtime_error("\"" + key + "\" is null, expected " + kind);
  const json::Value& v = *n.v;
  const auto wrong = [&] { return std::runtime_error("\"" + key + "\" is " + n.shown() + ", expected " + kind); };
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw wrong();
    return v.text();
  } else if constexpr (std::is_floating_point_v<T>) {
    const std::optional<double> d = v.as_double();
    if (!d || std::abs(*d) > static_cast<double>(std::numeric_limits<T>::max())) throw wrong();
    return static_cast<T>(*d);
  } else if constexpr (std::is_integral_v<T>) {
    T out{};
    const std::string& t = v.text();
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
    if (!v.is_number() || ec != std::errc() || end != t.data() + t.size()) throw wrong();
    return out;
  } else {
    T out;
    if (!v.is_array()) throw wrong();
    for (const json::Value& x : v.items()) {
      const std::optional<int64_t> i = x.as_int64();
      if (!i) throw wrong();
      out.push_back(*i);
    }
    return out;
  }
}

// "units[3].numel": a list entry's field, named with its index.
std::string at(const char* list, size_t i, const std::string& field) {
  return std::string(list) + "[" + std::to_string(i) + "]" + field;
}

}  // namespace

int64_t ShardFile::total_elements() const {
  int64_t n = 0;
  for (const ShardSlice& s : slices) n += s.length;
  return n;
}

int Manifest::section_index(const std::string& name) const {
  for (size_t i = 0; i < sections.size(); ++i) {
    if (sections[i] == name) return static_cast<int>(i);
  }
  return -1;
}

std::string manifest_to_json(const Manifest& m) {
  const GptShape& s = m.shape;
  std::ostringstream o;
  o.precision(9);
  o << "{\n  \"format\": \"gpt-train checkpoint\",\n  \"version\": " << m.version
    << ",\n  \"kind\": " << json_string(m.kind) << ",\n  \"step\": " << m.step
    << ",\n  \"tokens_seen\": " << m.tokens_seen << ",\n  \"model\": {\"n_layer\": " << s.n_layer
    << ", \"n_head\": " << s.n_head << ", \"n_embd\": " << s.n_embd << ", \"block_size\": " << s.block_size
    << ", \"vocab_size\": " << s.vocab_size << ", \"dropout\": " << s.dropout << ", \"tied_embeddings\": true},\n";
  if (m.kind == "checkpoint") {
    o << "  \"data_loader\": {\"batch_index\": " << m.loader_batch_index << ", \"global_batch\": " << m.global_batch
      << ", \"sampling\": " << json_string(m.sampling) << "},\n"
      << "  \"rng\": {\"kind\": \"philox4x32-10, counter-based on (seed, step, row)\", \"seed\": " << m.seed << "},\n"
      << "  \"optimizer\": {\"kind\": \"adamw\", \"steps_taken\": " << m.adam_steps << ", \"beta1\": " << m.beta1
      << ", \"beta2\": " << m.beta2 << ", \"eps\": " << m.eps << ", \"weight_decay\": " << m.weight_decay << "},\n"
      << "  \"parallel\": {\"strategy\": " << json_string(m.strategy) << ", \"world_size\": " << m.world_size
      << ", \"shard_group_size\": " << m.shard_group_size << ", \"param_dtype\": " << json_string(m.param_dtype)
      << ", \"reduce_dtype\": " << json_string(m.reduce_dtype) << "},\n";
  }
  o << "  \"dtype\": \"f32\",\n  \"sections\": [";
  for (size_t i = 0; i < m.sections.size(); ++i) o << (i ? ", " : "") << json_string(m.sections[i]);
  o << "],\n  \"units\": [\n";
  const ModelLayout layout = ModelLayout::build(s);
  int64_t base = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    o << "    {\"name\": " << json_string(unit.name) << ", \"offset\": " << base << ", \"numel\": " << unit.numel
      << ", \"params\": [";
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const ParamSpec& p = unit.params[i];
      o << (i ? ", " : "") << "{\"name\": " << json_string(p.name) << ", \"shape\": [";
      for (size_t d = 0; d < p.shape.size(); ++d) o << (d ? ", " : "") << p.shape[d];
      o << "], \"dtype\": \"f32\", \"offset\": " << p.offset << ", \"numel\": " << p.numel << "}";
    }
    o << "]}" << (u + 1 < layout.units.size() ? "," : "") << "\n";
    base += unit.numel;
  }
  o << "  ],\n  \"shards\": [\n";
  for (size_t f = 0; f < m.shards.size(); ++f) {
    const ShardFile& sh = m.shards[f];
    o << "    {\"file\": " << json_string(sh.file) << ", \"rank\": " << sh.rank
      << ", \"bytes\": " << sh.bytes(m.sections.size()) << ", \"slices\": [";
    for (size_t i = 0; i < sh.slices.size(); ++i) {
      const ShardSlice& sl = sh.slices[i];
      o << (i ? ",\n      " : "\n      ") << "{\"unit\": " << sl.unit << ", \"begin\": " << sl.begin
        << ", \"length\": " << sl.length << ", \"crc32c\": [";
      for (size_t k = 0; k < sl.crc.size(); ++k) o << (k ? ", " : "") << json_string(hex32(sl.crc[k]));
      o << "]}";
    }
    o << "]}" << (f + 1 < m.shards.size() ? "," : "") << "\n";
  }
  o << "  ],\n  \"tokenizer\": " << (m.tokenizer.empty() ? "null" : json_string(m.tokenizer));
  if (m.tokenizer_crc) o << ",\n  \"tokenizer_crc32c\": " << json_string(hex32(*m.tokenizer_crc));
  o << ",\n  \"config\": " << (m.config.empty() ? "null" : json_string(m.config));
  if (m.config_crc) o << ",\n  \"config_crc32c\": " << json_string(hex32(*m.config_crc));
  o << "\n}\n";
  return o.str();
}

Expected<Manifest> parse_manifest(const std::string& text, const std::string& path) {
  Manifest m;
  try {
    Expected<json::Value> parsed = json::parse(text);
    if (!parsed) return parsed.status().with_context(path + ": malformed manifest");
    const Node j{&*parsed};
    if (!j["format"] || !j["format"].v->is_string() || j["format"].v->text() != "gpt-train checkpoint") {
      return Status::corruption(path +
                                ": not a gpt-train checkpoint manifest (no \"format\": \"gpt-train checkpoint\")");
    }
    m.version = get<int>(j["version"], "version");
    if (m.version != 1 && m.version != kCheckpointVersion) {
      return Status::failed_precondition(path + ": manifest version " + std::to_string(m.version) +
                                         "; this build reads versions 1 and " + std::to_string(kCheckpointVersion));
    }
    const Node model = j["model"];
    m.shape.n_layer = get<int>(model["n_layer"], "model.n_layer");
    m.shape.n_head = get<int>(model["n_head"], "model.n_head");
    m.shape.n_embd = get<int>(model["n_embd"], "model.n_embd");
    m.shape.block_size = get<int>(model["block_size"], "model.block_size");
    m.shape.vocab_size = get<int>(model["vocab_size"], "model.vocab_size");
    m.shape.dropout = get<float>(model["dropout"], "model.dropout", 0.0f);
    m.step = get<int64_t>(j["step"], "step", int64_t{0});  // version 1 model directories have none
    const GptShape& s = m.shape;
    const auto impossible = [&](const char* key, int value, const std::string& expected) {
      return Status::corruption(path + ": impossible model shape: \"" + key + "\" is " + std::to_string(value) +
                                ", expected " + expected);
    };
    if (s.n_layer < 1 || s.n_layer > 4096) return impossible("model.n_layer", s.n_layer, "in [1, 4096]");
    if (s.n_embd < 1 || s.n_embd > (1 << 20)) return impossible("model.n_embd", s.n_embd, "in [1, 2^20]");
    if (s.n_head < 1 || s.n_embd % s.n_head != 0) {
      return impossible("model.n_head", s.n_head, "a divisor of model.n_embd " + std::to_string(s.n_embd));
    }
    if (s.block_size < 1) return impossible("model.block_size", s.block_size, ">= 1");
    if (s.vocab_size < 1 || s.vocab_size > (1 << 24)) {
      return impossible("model.vocab_size", s.vocab_size, "in [1, 2^24]");
    }
    const ModelLayout layout = ModelLayout::build(s);
    const Node units = j["units"];
    if (!units.is_list() || units.size() != layout.units.size()) {
      return Status::corruption(path + ": the unit list does not match the model shape (" +
                                std::to_string(layout.units.size()) + " units expected)");
    }
    int64_t unit_offset = 0;
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const UnitLayout& want = layout.units[u];
      const std::string name = get<std::string>(units[u]["name"], at("units", u, ".name"));
      const auto mismatch = [&](const std::string& what) {
        return Status::corruption(path + ": unit " + std::to_string(u) + " ('" + name + "') does not match the " +
                                  "layout of this model shape: " + what);
      };
      if (name != want.name) return mismatch("expected the name '" + want.name + "'");
      if (get<int64_t>(units[u]["numel"], at("units", u, ".numel")) != want.numel) {
        return mismatch("expected \"numel\" " + std::to_string(want.numel));
      }
      // What the manifest describes besides (for other readers: the loaders take the layout from the shape), held to
      // the layout where it is there, so that `checkpoint verify` passes only a manifest that is right throughout.
      if (units[u]["offset"] && get<int64_t>(units[u]["offset"], at("units", u, ".offset")) != unit_offset) {
        return mismatch("expected \"offset\" " + std::to_string(unit_offset));
      }
      unit_offset += want.numel;
      const Node params = units[u]["params"];
      if (!params) continue;
      if (!params.is_list() || params.size() != want.params.size()) {
        return mismatch("expected " + std::to_string(want.params.size()) + " params");
      }
      for (size_t i = 0; i < want.params.size(); ++i) {
        const ParamSpec& ps = want.params[i];
        const Node p = params[i];
        if (get<std::string>(p["name"], at("units", u, ".params[" + std::to_string(i) + "].name")) != ps.name ||
            get<int64_t>(p["offset"], at("units", u, ".params[" + std::to_string(i) + "].offset")) != ps.offset ||
            get<int64_t>(p["numel"], at("units", u, ".params[" + std::to_string(i) + "].numel")) != ps.numel ||
            get<std::vector<int64_t>>(p["shape"], at("units", u, ".params[" + std::to_string(i) + "].shape")) !=
                std::vector<int64_t>(ps.shape.begin(), ps.shape.end())) {
          std::string shape;
          for (const int64_t d : ps.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
          return mismatch("param " + std::to_string(i) + " should be '" + ps.name + "' of shape [" + shape +
                          "] at offset " + std::to_string(ps.offset) + ", " + std::to_string(ps.numel) + " elements");
        }
      }
    }
    // Names of files in the directory: plain names only, so a crafted manifest cannot point elsewhere.
    auto plain_name = [&](const std::string& key) -> Expected<std::string> {
      const Node field = j[key.c_str()];
      if (!field || field.v->is_null()) return std::string();
      if (!field.v->is_string()) {
        return Status::corruption(path + ": \"" + key + "\" is " + field.shown() + ", expected a file name or null");
      }
      const std::string& name = field.v->text();
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
        return Status::corruption(path + ": \"" + key + "\" must be a plain file name, got '" + name + "'");
      }
      return name;
    };
    GPT_ASSIGN_OR_RETURN(m.tokenizer, plain_name("tokenizer"));
    if (m.version == 1) {  // one shard holding the whole flat buffer, one CRC for the file
      m.kind = "model";
      const Node sh = j["shards"][size_t{0}];
      ShardFile f;
      f.file = get<std::string>(sh["file"], "shards[0].file");
      f.file_crc = parse_crc(sh["crc32c"]);
      for (size_t u = 0; u < layout.units.size(); ++u) {
        f.slices.push_back({static_cast<int>(u), 0, layout.units[u].numel, {}});
      }
      m.shards.push_back(std::move(f));
      return m;
    }
    m.kind = get<std::string>(j["kind"], "kind");
    if (m.kind != "checkpoint" && m.kind != "model") {
      return Status::corruption(path + ": kind '" + m.kind + "', expected checkpoint or model");
    }
    m.tokens_seen = get<int64_t>(j["tokens_seen"], "tokens_seen");
    if (m.step < 0 || m.tokens_seen < 0) {
      return Status::corruption(path + ": \"step\" " + std::to_string(m.step) + " or \"tokens_seen\" " +
                                std::to_string(m.tokens_seen) + " is negative");
    }
    m.sections.clear();
    const Node sections = j["sections"];
    for (size_t i = 0; i < sections.size(); ++i)
      m.sections.push_back(get<std::string>(sections[i], at("sections", i, "")));
    if (m.sections.empty() || m.sections[0] != "master") {
      return Status::corruption(path + ": sections must start with \"master\"");
    }
    GPT_ASSIGN_OR_RETURN(m.config, plain_name("config"));
    if (j["tokenizer_crc32c"] && !m.tokenizer.empty()) {
      m.tokenizer_crc = parse_crc(j["tokenizer_crc32c"], "tokenizer_crc32c");
    }
    if (j["config_crc32c"] && !m.config.empty()) m.config_crc = parse_crc(j["config_crc32c"], "config_crc32c");
    if (m.kind == "checkpoint") {
      const Node dl = j["data_loader"], opt = j["optimizer"], par = j["parallel"];
      m.loader_batch_index = get<uint64_t>(dl["batch_index"], "data_loader.batch_index");
      m.global_batch = get<int64_t>(dl["global_batch"], "data_loader.global_batch");
      m.sampling = get<std::string>(dl["sampling"], "data_loader.sampling");
      m.seed = get<uint64_t>(j["rng"]["seed"], "rng.seed");
      m.adam_steps = get<int64_t>(opt["steps_taken"], "optimizer.steps_taken");
      m.beta1 = get<float>(opt["beta1"], "optimizer.beta1");
      m.beta2 = get<float>(opt["beta2"], "optimizer.beta2");
      m.eps = get<float>(opt["eps"], "optimizer.eps");
      m.weight_decay = get<float>(opt["weight_decay"], "optimizer.weight_decay");
      m.strategy = get<std::string>(par["strategy"], "parallel.strategy");
      m.world_size = get<int>(par["world_size"], "parallel.world_size");
      m.shard_group_size = get<int>(par["shard_group_size"], "parallel.shard_group_size");
      m.param_dtype = get<std::string>(par["param_dtype"], "parallel.param_dtype");
      m.reduce_dtype = get<std::string>(par["reduce_dtype"], "parallel.reduce_dtype");
      if (m.section_index("adam_m") < 0 || m.section_index("adam_v") < 0) {
        return Status::corruption(path + ": a checkpoint needs sections adam_m and adam_v");
      }
      // What resuming trusts, in range (a hand-edited or damaged manifest would otherwise train on quietly: a
      // negative step gives a negative learning rate, a negative AdamW step count NaN).
      const auto field = [&](const char* name, const std::string& value, const char* expected) {
        return Status::corruption(path + ": \"" + name + "\" is " + value + ", expected " + expected);
      };
      if (m.global_batch < 1) return field("data_loader.global_batch", std::to_string(m.global_batch), ">= 1");
      if (m.adam_steps < 0 || m.adam_steps > m.step) {
        return field("optimizer.steps_taken", std::to_string(m.adam_steps), "in [0, step]");
      }
      if (!(m.beta1 >= 0.0f && m.beta1 < 1.0f)) return field("optimizer.beta1", std::to_string(m.beta1), "in [0, 1)");
      if (!(m.beta2 >= 0.0f && m.beta2 < 1.0f)) return field("optimizer.beta2", std::to_string(m.beta2), "in [0, 1)");
      if (!(m.eps > 0.0f && std::isfinite(m.eps))) return field("optimizer.eps", std::to_string(m.eps), "> 0");
      if (!(m.weight_decay >= 0.0f && std::isfinite(m.weight_decay))) {
        return field("optimizer.weight_decay", std::to_string(m.weight_decay), ">= 0");
      }
      if (m.world_size < 1) return field("parallel.world_size", std::to_string(m.world_size), ">= 1");
      if (m.shard_group_size < 1 || m.shard_group_size > m.world_size) {
        return field("parallel.shard_group_size", std::to_string(m.shard_group_size), "in [1, world_size]");
      }
    }
    std::vector<int> ranks;
    const Node shards = j["shards"];
    for (size_t s_i = 0; s_i < shards.size(); ++s_i) {
      const Node sh = shards[s_i];
      ShardFile f;
      f.file = get<std::string>(sh["file"], at("shards", s_i, ".file"));
      f.rank = get<int>(sh["rank"], at("shards", s_i, ".rank"));
      if (f.file.empty() || f.file.find('/') != std::string::npos || f.file[0] == '.') {
        return Status::corruption(path + ": shard file name '" + f.file + "' must be a plain file name");
      }
      // One shard per saving rank (a rank that holds nothing writes none), each rank one of the saving world's.
      const bool in_world = f.rank >= 0 && (m.kind != "checkpoint" || f.rank < m.world_size);
      if (!in_world || std::find(ranks.begin(), ranks.end(), f.rank) != ranks.end()) {
        return Status::corruption(path + ": shard '" + f.file + "' has \"rank\" " + std::to_string(f.rank) + ", " +
                                  (in_world ? "which another shard has too"
                                   : m.kind == "checkpoint"
                                       ? "expected in [0, parallel.world_size " + std::to_string(m.world_size) + ")"
                                       : std::string("expected >= 0")));
      }
      ranks.push_back(f.rank);
      const Node slices = sh["slices"];
      for (size_t l = 0; l < slices.size(); ++l) {
        const Node sl = slices[l];
        const std::string name = at("shards", s_i, ".slices[" + std::to_string(l) + "]");
        ShardSlice slice{get<int>(sl["unit"], name + ".unit"),
                         get<int64_t>(sl["begin"], name + ".begin"),
                         get<int64_t>(sl["length"], name + ".length"),
                         {}};
        for (size_t k = 0; k < sl["crc32c"].size(); ++k) slice.crc.push_back(parse_crc(sl["crc32c"][k]));
        if (slice.unit < 0 || slice.unit >= static_cast<int>(layout.units.size()) || slice.begin < 0 ||
            slice.length < 1 || slice.length > layout.units[slice.unit].numel - slice.begin ||
            slice.crc.size() != m.sections.size()) {
          return Status::corruption(path + ": shard '" + f.file + "' has a slice outside its unit or without " +
                                    "one checksum per section");
        }
        f.slices.push_back(std::move(slice));
      }
      if (get<int64_t>(sh["bytes"], at("shards", s_i, ".bytes")) != f.bytes(m.sections.size())) {
        return Status::corruption(path + ": shard '" + f.file + "' bytes do not match its slices");
      }
      m.shards.push_back(std::move(f));
    }
  } catch (const std::exception& e) {
    return Status::corruption(path + ": malformed manifest: " + e.what());
  }
  // Every element of every unit must be stored exactly once.
  const ModelLayout layout = ModelLayout::build(m.shape);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(layout.units.size());
  for (const ShardFile& f : m.shards) {
    for (const ShardSlice& s : f.slices) covered[s.unit].push_back({s.begin, s.begin + s.length});
  }
  for (size_t u = 0; u < covered.size(); ++u) {
    std::sort(covered[u].begin(), covered[u].end());
    int64_t at = 0;
    bool exact = true;
    for (const auto& [b, e] : covered[u]) {
      if (b != at) {
        exact = false;
        break;
      }
      at = e;
    }
    if (!exact || at != layout.units[u].numel) {
      return Status::corruption(path + ": the shards do not cover unit '" + layout.units[u].name +
                                "' exactly once (elements from " + std::to_string(at) + " missing or overlapping)");
    }
  }
  return m;
}

}  // namespace gpt
