#include "checkpoint/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <sstream>

#include "checkpoint/atomic_file_writer.h"
#include "checkpoint/json_text.h"
#include "core/check.h"

namespace gpt {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors and shard files are little-endian");

struct NameMap {
  const char* ours;
  const char* hf;
  bool transpose;
};

constexpr std::array<NameMap, 12> kBlockNames = {{
    {"ln_1.weight", "ln_1.weight", false},
    {"ln_1.bias", "ln_1.bias", false},
    {"attn.qkv.weight", "attn.c_attn.weight", true},
    {"attn.qkv.bias", "attn.c_attn.bias", false},
    {"attn.proj.weight", "attn.c_proj.weight", true},
    {"attn.proj.bias", "attn.c_proj.bias", false},
    {"ln_2.weight", "ln_2.weight", false},
    {"ln_2.bias", "ln_2.bias", false},
    {"mlp.fc.weight", "mlp.c_fc.weight", true},
    {"mlp.fc.bias", "mlp.c_fc.bias", false},
    {"mlp.proj.weight", "mlp.c_proj.weight", true},
    {"mlp.proj.bias", "mlp.c_proj.bias", false},
}};

const NameMap& block_name(const std::string& ours) {
  for (const NameMap& m : kBlockNames) {
    if (ours == m.ours) return m;
  }
  GPT_CHECK_MSG(false, (ours + ": block parameter without a Hugging Face GPT-2 name").c_str());
  return kBlockNames[0];
}

// The JSON header, padded with spaces so that the data section starts at a multiple of 8.
std::string header_json(const std::vector<HfTensor>& tensors, const Manifest& m) {
  std::ostringstream o;
  o << "{";
  int64_t offset = 0;
  for (const HfTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    o << json_string(t.name) << ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) o << (d ? "," : "") << t.shape[d];
    o << "],\"data_offsets\":[" << offset << "," << offset + numel * 4 << "]},";
    offset += numel * 4;
  }
  const GptShape& s = m.shape;
  const std::pair<const char*, std::string> meta[] = {
      {"format", "pt"},
      {"producer", std::string("gpt-train ") + GPT_VERSION},
      {"source_kind", m.kind},
      {"step", std::to_string(m.step)},
      {"n_layer", std::to_string(s.n_layer)},
      {"n_head", std::to_string(s.n_head)},
      {"n_embd", std::to_string(s.n_embd)},
      {"n_positions", std::to_string(s.block_size)},
      {"vocab_size", std::to_string(s.vocab_size)},
      {"tied_embeddings", "lm_head.weight = wte.weight"},
  };
  o << "\"__metadata__\":{";
  for (size_t i = 0; i < std::size(meta); ++i) {
    o << (i ? "," : "") << json_string(meta[i].first) << ":" << json_string(meta[i].second);
  }
  o << "}}";
  std::string h = o.str();
  h.append((8 - (8 + h.size()) % 8) % 8, ' ');
  return h;
}

std::span<const char> as_bytes(const float* p, int64_t n) {
  return {reinterpret_cast<const char*>(p), static_cast<size_t>(n) * sizeof(float)};
}

// Appends the (rows, cols) row-major matrix `src` as its (cols, rows) transpose, a bounded chunk at a time.
Status append_transposed(AtomicFileWriter& out, const float* src, int64_t rows, int64_t cols,
                         std::vector<float>& chunk) {
  const int64_t out_rows_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk.capacity()) / rows);
  for (int64_t c0 = 0; c0 < cols; c0 += out_rows_per_chunk) {
    const int64_t c1 = std::min(cols, c0 + out_rows_per_chunk);
    chunk.resize(static_cast<size_t>((c1 - c0) * rows));
    for (int64_t c = c0; c < c1; ++c) {
      float* dst = chunk.data() + (c - c0) * rows;
      for (int64_t r = 0; r < rows; ++r) dst[r] = src[r * cols + c];
    }
    GPT_RETURN_IF_ERROR(out.append(as_bytes(chunk.data(), static_cast<int64_t>(chunk.size()))));
  }
  return Status::ok();
}

}  // namespace

std::vector<HfTensor> hf_gpt2_tensors(const ModelLayout& layout) {
  std::vector<HfTensor> out;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    const bool is_block = static_cast<int>(u) != ModelLayout::kEmbedUnit && static_cast<int>(u) != layout.head_unit();
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const ParamSpec& p = unit.params[i];
      HfTensor t;
      t.unit = static_cast<int>(u);
      t.param = static_cast<int>(i);
      t.shape = p.shape;
      if (is_block) {
        const NameMap& m = block_name(p.name);
        t.name = "h." + std::to_string(u - 1) + "." + m.hf;
        t.transpose = m.transpose;
        GPT_CHECK(!t.transpose || t.shape.size() == 2);
        if (t.transpose) std::swap(t.shape[0], t.shape[1]);
      } else if (static_cast<int>(u) == ModelLayout::kEmbedUnit) {
        t.name = p.name + ".weight";  // wte.weight, wpe.weight
      } else {
        t.name = p.name;  // ln_f.weight, ln_f.bias
      }
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::string hf_gpt2_config_json(const GptShape& shape, std::optional<int32_t> end_of_text) {
  std::ostringstream j;
  j << "{\n"
    << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
    << "  \"model_type\": \"gpt2\",\n"
    << "  \"vocab_size\": " << shape.vocab_size << ",\n"
    << "  \"n_positions\": " << shape.block_size << ",\n"
    << "  \"n_ctx\": " << shape.block_size << ",\n"
    << "  \"n_embd\": " << shape.n_embd << ",\n"
    << "  \"n_layer\": " << shape.n_layer << ",\n"
    << "  \"n_head\": " << shape.n_head << ",\n"
    << "  \"n_inner\": null,\n"
    << "  \"activation_function\": \"gelu_new\",\n"
    << "  \"layer_norm_epsilon\": 1e-05,\n"
    << "  \"resid_pdrop\": " << shape.dropout << ",\n"
    << "  \"embd_pdrop\": " << shape.dropout << ",\n"
    << "  \"attn_pdrop\": " << shape.dropout << ",\n"
    << "  \"initializer_range\": 0.02,\n"
    << "  \"scale_attn_weights\": true,\n"
    << "  \"tie_word_embeddings\": true,\n";
  const int32_t eot = end_of_text ? *end_of_text : shape.vocab_size == 50257 ? 50256 : -1;
  if (eot >= 0) j << "  \"bos_token_id\": " << eot << ",\n  \"eos_token_id\": " << eot << ",\n";
  j << "  \"torch_dtype\": \"float32\"\n}\n";
  return j.str();
}

Status consolidate_to_safetensors(const CheckpointReader& reader, const std::string& out_path) {
  const ModelLayout& layout = reader.layout();
  const std::vector<HfTensor> tensors = hf_gpt2_tensors(layout);
  const std::string header = header_json(tensors, reader.manifest());
  GPT_ASSIGN_OR_RETURN(AtomicFileWriter out, AtomicFileWriter::open(out_path));
  std::array<char, 8> n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  GPT_RETURN_IF_ERROR(out.append(n));
  GPT_RETURN_IF_ERROR(out.append(header));

  std::vector<float> unit_buf, chunk;
  chunk.reserve((size_t{1} << 20) / sizeof(float));
  int loaded = -1;
  for (const HfTensor& t : tensors) {
    if (t.unit != loaded) {
      const int64_t numel = layout.units[static_cast<size_t>(t.unit)].numel;
      unit_buf.resize(static_cast<size_t>(numel));
      GPT_RETURN_IF_ERROR(reader.read("master", t.unit, 0, numel, unit_buf.data()));
      loaded = t.unit;
    }
    const ParamSpec& p = layout.units[static_cast<size_t>(t.unit)].params[static_cast<size_t>(t.param)];
    const float* src = unit_buf.data() + p.offset;
    if (t.transpose) {
      GPT_RETURN_IF_ERROR(append_transposed(out, src, p.shape[0], p.shape[1], chunk));
    } else {
      GPT_RETURN_IF_ERROR(out.append(as_bytes(src, p.numel)));
    }
  }
  GPT_CHECK(out.size() == static_cast<int64_t>(8 + header.size()) + layout.total_numel * 4);
  return out.commit();
}

}  // namespace gpt
