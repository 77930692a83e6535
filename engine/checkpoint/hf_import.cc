#include "checkpoint/hf_import.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "checkpoint/safetensors.h"
#include "core/atomic_file.h"
#include "core/dtype.h"
#include "core/json.h"

namespace gpt {

namespace {

namespace fs = std::filesystem;
static_assert(std::endian::native == std::endian::little, "safetensors files are little-endian");

struct Entry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // within the data section
};

// IEEE half to fp32, exactly (subnormals, infinities and NaNs included).
float half_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    return sign ? -v : v;
  }
  const uint32_t bits = exp == 0x1f ? sign | 0x7f800000u | (mant << 13) : sign | ((exp + 112) << 23) | (mant << 13);
  return std::bit_cast<float>(bits);
}

// config.json's GPT-2 shape; a value of the wrong type is an error naming the file and the key.
Expected<GptShape> read_config(const std::string& path) {
  std::string text;
  GPT_RETURN_IF_ERROR(read_file(path, &text));
  Expected<json::Value> parsed = json::parse(text);
  if (!parsed) return parsed.status().with_context(path);
  const json::Value& j = *parsed;
  if (!j.is_object()) return Status::invalid_argument(path + ": expected a JSON object");
  // A key's value, null when absent or null; else of `type`, or an error naming the key.
  auto field = [&](const char* key, json::Type type) -> Expected<const json::Value*> {
    const json::Value* v = j.find(key);
    if (v == nullptr || v->is_null()) return nullptr;
    if (v->type() != type) {
      return Status::invalid_argument(path + ": \"" + key + "\" is " + json::type_name(v->type()) + ", expected " +
                                      json::type_name(type));
    }
    return v;
  };
  auto str = [&](const char* key, const char* fallback) -> Expected<std::string> {
    GPT_ASSIGN_OR_RETURN(const json::Value* v, field(key, json::Type::kString));
    return v != nullptr ? v->text() : std::string(fallback);
  };
  auto flag = [&](const char* key, bool fallback) -> Expected<bool> {
    GPT_ASSIGN_OR_RETURN(const json::Value* v, field(key, json::Type::kBool));
    return v != nullptr ? v->boolean() : fallback;
  };
  auto integer = [&](const char* key, std::optional<int> fallback = std::nullopt) -> Expected<int> {
    GPT_ASSIGN_OR_RETURN(const json::Value* v, field(key, json::Type::kNumber));
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Status::invalid_argument(path + ": no \"" + std::string(key) + "\"");
    }
    const std::optional<int64_t> i = v->as_int64();
    if (!i || *i < INT32_MIN || *i > INT32_MAX) {
      return Status::invalid_argument(path + ": \"" + std::string(key) + "\" is " + v->text() +
                                      ", not an integer of 32 bits");
    }
    return static_cast<int>(*i);
  };
  GPT_ASSIGN_OR_RETURN(const std::string type, str("model_type", "gpt2"));
  GPT_ASSIGN_OR_RETURN(const std::string act, str("activation_function", "gelu_new"));
  if (type != "gpt2") {
    return Status::invalid_argument(path + ": model_type \"" + type + "\": gpt-train imports GPT-2 (\"gpt2\") only");
  }
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return Status::invalid_argument(path + ": activation_function \"" + act +
                                    "\": gpt-train's GELU is the tanh approximation (gelu_new)");
  }
  GPT_ASSIGN_OR_RETURN(const json::Value* eps_field, field("layer_norm_epsilon", json::Type::kNumber));
  const double eps = eps_field != nullptr ? eps_field->as_double().value_or(HUGE_VAL) : 1e-5;
  if (std::abs(eps - 1e-5) > 1e-12) {
    return Status::invalid_argument(path + ": layer_norm_epsilon " + eps_field->text() +
                                    ": gpt-train's LayerNorm uses 1e-5");
  }
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    GPT_ASSIGN_OR_RETURN(const bool on, flag(key, false));
    if (on)
      return Status::invalid_argument(path + ": " + key + " true: not GPT-2's attention, which gpt-train computes");
  }
  GPT_ASSIGN_OR_RETURN(const bool scaled, flag("scale_attn_weights", true));
  if (!scaled) {
    return Status::invalid_argument(path + ": scale_attn_weights false: gpt-train scales scores by 1/sqrt(head size)");
  }
  GPT_ASSIGN_OR_RETURN(const bool tied, flag("tie_word_embeddings", true));
  if (!tied) return Status::invalid_argument(path + ": tie_word_embeddings false: gpt-train's LM head is wte");
  GptShape s;
  GPT_ASSIGN_OR_RETURN(s.n_layer, integer("n_layer"));
  GPT_ASSIGN_OR_RETURN(s.n_head, integer("n_head"));
  GPT_ASSIGN_OR_RETURN(s.n_embd, integer("n_embd"));
  GPT_ASSIGN_OR_RETURN(const int n_ctx, integer("n_ctx", 0));
  GPT_ASSIGN_OR_RETURN(s.block_size, integer("n_positions", n_ctx > 0 ? std::optional<int>(n_ctx) : std::nullopt));
  GPT_ASSIGN_OR_RETURN(s.vocab_size, integer("vocab_size"));
  GPT_ASSIGN_OR_RETURN(const int n_inner, integer("n_inner", 0));
  if (n_inner != 0 && n_inner != 4 * s.n_embd) {
    return Status::invalid_argument(path + ": n_inner " + std::to_string(n_inner) +
                                    ": gpt-train's MLP is 4 * n_embd = " + std::to_string(4 * s.n_embd) + " wide");
  }
  if (s.n_layer < 1 || s.n_head < 1 || s.n_embd < 1 || s.n_embd % s.n_head != 0 || s.block_size < 1 ||
      s.vocab_size < 1 || s.vocab_size > 65536) {
    return Status::invalid_argument(path + ": impossible shape (n_layer " + std::to_string(s.n_layer) + ", n_head " +
                                    std::to_string(s.n_head) + ", n_embd " + std::to_string(s.n_embd) +
                                    ", n_positions " + std::to_string(s.block_size) + ", vocab_size " +
                                    std::to_string(s.vocab_size) + "; tokens are uint16)");
  }
  return s;
}

// The header's tensors by name ("transformer." dropped), and where the data section starts.
Expected<std::map<std::string, Entry>> read_header(std::ifstream& in, const std::string& path, int64_t file_size,
                                                   int64_t* data_start) {
  uint64_t n = 0;
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(&n), 8)) {
    return Status::corruption(path + ": shorter than a safetensors header");
  }
  if (n > static_cast<uint64_t>(file_size - 8) || n > (uint64_t{100} << 20)) {
    return Status::corruption(path + ": header length " + std::to_string(n) + " does not fit the file's " +
                              std::to_string(file_size) + " bytes (not a safetensors file?)");
  }
  std::string text(static_cast<size_t>(n), '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  *data_start = 8 + static_cast<int64_t>(n);
  std::map<std::string, Entry> out;
  Expected<json::Value> parsed = json::parse(text);
  if (!parsed) return parsed.status().with_context(path + ": unreadable header");
  const json::Value& h = *parsed;
  if (!h.is_object()) return Status::corruption(path + ": the header is not a JSON object");
  // A list of integers (a shape, data offsets), or none.
  const auto integers = [](const json::Value* v) -> std::optional<std::vector<int64_t>> {
    if (v == nullptr || !v->is_array()) return std::nullopt;
    std::vector<int64_t> out;
    for (const json::Value& x : v->items()) {
      const std::optional<int64_t> i = x.as_int64();
      if (!i) return std::nullopt;
      out.push_back(*i);
    }
    return out;
  };
  for (size_t i = 0; i < h.size(); ++i) {
    std::string name = h.key(i);
    if (name == "__metadata__") continue;
    if (name.rfind("transformer.", 0) == 0) name = name.substr(12);
    const json::Value& t = h.item(i);
    const json::Value* dtype = t.find("dtype");
    const auto shape = integers(t.find("shape")), off = integers(t.find("data_offsets"));
    if (dtype == nullptr || !dtype->is_string() || !shape || !off) {
      return Status::corruption(path + ": unreadable header: tensor " + h.key(i) +
                                " needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (lists of integers)");
    }
    if (off->size() != 2 || (*off)[0] < 0 || (*off)[1] < (*off)[0] || (*off)[1] > file_size - *data_start) {
      return Status::corruption(path + ": tensor " + name + ": data_offsets outside the file (truncated?)");
    }
    Entry e;
    e.dtype = dtype->text();
    e.shape = *shape;
    e.begin = (*off)[0];
    e.end = (*off)[1];
    out[name] = std::move(e);
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) t += ", ";
    t += std::to_string(s[i]);
  }
  return t + ")";
}

// Tensor `e` as fp32 values, in the file's order.
Expected<std::vector<float>> read_values(std::ifstream& in, const std::string& path, const std::string& name,
                                         const Entry& e, int64_t data_start) {
  int64_t numel = 1;
  for (int64_t d : e.shape) numel *= d;
  const int64_t size = e.dtype == "F32" ? 4 : e.dtype == "BF16" || e.dtype == "F16" ? 2 : 0;
  if (size == 0)
    return Status::invalid_argument(path + ": tensor " + name + " is " + e.dtype + ": expected F32, BF16 or F16");
  if (e.end - e.begin != numel * size) {
    return Status::corruption(path + ": tensor " + name + " holds " + std::to_string(e.end - e.begin) +
                              " bytes, its shape and dtype need " + std::to_string(numel * size));
  }
  std::vector<float> v(static_cast<size_t>(numel));
  in.seekg(data_start + e.begin);
  if (size == 4) {
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(numel * 4));
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(numel));
    in.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(numel * 2));
    for (int64_t i = 0; i < numel; ++i) {
      v[i] = e.dtype == "BF16" ? bf16_to_f32(bf16{h[i]}) : half_to_f32(h[i]);
    }
  }
  if (!in) return Status::io_error(path + ": reading tensor " + name + " failed");
  return v;
}

bool skipped(const std::string& name) {
  const auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

}  // namespace

Expected<HfGpt2> read_hf_gpt2(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (ec) return Status::io_error(path + ": " + ec.message());  // e.g. a directory it may not enter
    return Status::not_found(path +
                             ": no such file or directory (expected a Hugging Face GPT-2 directory with "
                             "config.json and model.safetensors, or a .safetensors file with config.json "
                             "beside it)");
  }
  const bool dir = fs::is_directory(path, ec);
  const std::string file = dir ? (fs::path(path) / "model.safetensors").string() : path;
  const std::string config = (dir ? fs::path(path) : fs::path(path).parent_path()) / "config.json";
  if (!fs::is_regular_file(config, ec)) {
    return Status::not_found(config + ": missing (the Hugging Face config.json gives the model's shape)");
  }
  if (!fs::is_regular_file(file, ec)) {
    if (dir && fs::exists(fs::path(path) / "model.safetensors.index.json", ec)) {
      return Status::invalid_argument(path +
                                      ": the weights are sharded (model.safetensors.index.json), which import "
                                      "does not read: save them as one file (save_pretrained(..., "
                                      "max_shard_size=\"100GB\"))");
    }
    return Status::not_found(file + ": missing");
  }
  HfGpt2 out;
  GPT_ASSIGN_OR_RETURN(out.shape, read_config(config));
  const ModelLayout layout = ModelLayout::build(out.shape);
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::io_error(file + ": cannot open");
  const int64_t file_size = static_cast<int64_t>(fs::file_size(file, ec));
  int64_t data_start = 0;
  GPT_ASSIGN_OR_RETURN(auto entries, read_header(in, file, file_size, &data_start));
  out.weights.assign(static_cast<size_t>(layout.total_numel), 0.0f);
  std::vector<int64_t> unit_offset;
  for (int64_t at = 0; const UnitLayout& u : layout.units) {
    unit_offset.push_back(at);
    at += u.numel;
  }
  for (const HfTensor& t : hf_gpt2_tensors(layout)) {
    const auto it = entries.find(t.name);
    if (it == entries.end()) return Status::not_found(file + ": no tensor " + t.name + " (config " + config + ")");
    if (it->second.shape != t.shape) {
      return Status::invalid_argument(file + ": tensor " + t.name + " is " + shape_text(it->second.shape) + ", " +
                                      config + " makes it " + shape_text(t.shape));
    }
    GPT_ASSIGN_OR_RETURN(const std::vector<float> v, read_values(in, file, t.name, it->second, data_start));
    const ParamSpec& p = layout.units[static_cast<size_t>(t.unit)].params[static_cast<size_t>(t.param)];
    float* dst = out.weights.data() + unit_offset[static_cast<size_t>(t.unit)] + p.offset;
    if (t.transpose) {  // the file's (in, out) Conv1D weight into our (out, in)
      const int64_t rows = t.shape[0], cols = t.shape[1];
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = v[static_cast<size_t>(r * cols + c)];
      }
    } else {
      std::copy(v.begin(), v.end(), dst);
    }
    entries.erase(it);
  }
  if (const auto head = entries.find("lm_head.weight"); head != entries.end()) {
    const std::vector<int64_t> wte_shape = {out.shape.vocab_size, out.shape.n_embd};
    if (head->second.shape != wte_shape) {
      return Status::invalid_argument(file + ": tensor lm_head.weight is " + shape_text(head->second.shape) +
                                      ", wte.weight " + shape_text(wte_shape) + ": gpt-train's LM head is tied");
    }
    GPT_ASSIGN_OR_RETURN(const std::vector<float> v, read_values(in, file, "lm_head.weight", head->second, data_start));
    if (std::memcmp(v.data(), out.weights.data(), v.size() * sizeof(float)) != 0) {  // bits: a NaN equals itself
      return Status::invalid_argument(file + ": lm_head.weight differs from wte.weight: gpt-train's LM head is tied");
    }
    entries.erase(head);
  }
  for (const auto& [name, e] : entries) {
    if (!skipped(name)) return Status::invalid_argument(file + ": unexpected tensor " + name + " (not GPT-2's)");
  }
  return out;
}

}  // namespace gpt
