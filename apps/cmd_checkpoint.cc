// `gpt-train checkpoint inspect|verify|consolidate DIR`: tools for checkpoint and model directories
// (engine/checkpoint/FORMAT.md). inspect prints the manifest for people; verify checks every CRC-32C;
// consolidate writes the master weights as one safetensors file with Hugging Face GPT-2 names. DIR is a step
// directory, a model directory, or a checkpoint root whose `latest` file names a step directory.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>

#include "apps/commands.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/hf_import.h"
#include "checkpoint/manifest.h"
#include "checkpoint/model_file.h"
#include "checkpoint/safetensors.h"
#include "core/atomic_file.h"
#include "data/tokenizer.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

struct CheckpointArgs {
  std::string dir;
  std::string out;
  bool no_tokenizer = false;
};

// "123456789 bytes (123.5 MB)".
std::string bytes_text(int64_t bytes) {
  std::ostringstream o;
  o << bytes << " bytes";
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = -1;
  while (v >= 1000 && u < 3) {
    v /= 1000;
    ++u;
  }
  if (u >= 0) {
    o.precision(v < 10 ? 2 : (v < 100 ? 3 : 4));
    o << " (" << v << " " << units[u] << ")";
  }
  return o.str();
}

// The manifest alone, so that inspect can describe a directory whose shard files are damaged.
Expected<Manifest> read_manifest(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::not_found(dir + ": no such checkpoint directory");
  const std::string path = (fs::path(dir) / "manifest.json").string();
  std::string text;
  Status st = read_file(path, &text);
  if (!st.is_ok()) {
    return Status::not_found(dir + " is not a complete gpt-train checkpoint or model directory: " + st.message());
  }
  return parse_manifest(text, path);
}

// "present", "missing" or the size mismatch of a file the manifest names.
std::string file_state(const fs::path& path, int64_t want_bytes) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "MISSING";
  if (want_bytes < 0) return "present";
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  if (ec) return "unreadable: " + ec.message();
  if (size != want_bytes) return "WRONG SIZE: " + std::to_string(size) + " bytes on disk";
  return "";
}

int inspect(const std::string& arg) {
  const std::string dir = resolve_checkpoint_dir(arg);
  Expected<Manifest> parsed = read_manifest(dir);
  if (!parsed) return report_error(parsed.status());
  const Manifest& m = *parsed;
  const GptShape& s = m.shape;
  std::ostringstream o;
  o << dir << (dir != arg ? "  (" + arg + "/latest)" : "") << "\n";
  o << "  kind:          " << m.kind << ", format version " << m.version << "\n";
  o << "  step:          " << m.step << "\n";
  if (m.version >= 2) o << "  tokens seen:   " << m.tokens_seen << "\n";
  o << "  model:         n_layer " << s.n_layer << ", n_head " << s.n_head << ", n_embd " << s.n_embd << ", block_size "
    << s.block_size << ", vocab_size " << s.vocab_size << ", dropout " << s.dropout << "\n";
  o << "  parameters:    " << s.num_params() << " (LM head tied to wte)\n";
  if (m.kind == "checkpoint") {
    o << "  saved by:      strategy " << m.strategy << ", world size " << m.world_size << ", shard group "
      << m.shard_group_size << "\n";
    o << "  precision:     params " << m.param_dtype << ", gradient reduce " << m.reduce_dtype
      << ", master weights and optimizer state fp32\n";
    o << "  data loader:   next global batch " << m.loader_batch_index << " (" << m.global_batch
      << " sequences per step, sampling " << m.sampling << "), seed " << m.seed << "\n";
    o << "  optimizer:     AdamW, " << m.adam_steps << " steps taken, beta1 " << m.beta1 << ", beta2 " << m.beta2
      << ", eps " << m.eps << ", weight decay " << m.weight_decay << "\n";
  } else {
    o << "  saved by:      weights only (no optimizer, data-loader or strategy state)\n";
  }
  o << "  sections:      ";
  for (size_t i = 0; i < m.sections.size(); ++i) o << (i ? ", " : "") << m.sections[i];
  o << " (fp32)\n";
  int64_t total = 0;
  for (const ShardFile& f : m.shards) total += f.bytes(m.sections.size());
  o << "  shard files:   " << m.shards.size() << ", " << bytes_text(total) << "\n";
  int problems = 0;  // files missing or of the wrong size: shown, and the exit status says so
  for (const ShardFile& f : m.shards) {
    const int64_t bytes = f.bytes(m.sections.size());
    const std::string state = file_state(fs::path(dir) / f.file, bytes);
    problems += state.empty() ? 0 : 1;
    o << "    " << f.file << "  rank " << f.rank << ", " << bytes << " bytes, " << f.slices.size()
      << (f.slices.size() == 1 ? " slice" : " slices") << (state.empty() ? "" : "  [" + state + "]") << "\n";
  }
  for (const auto& [what, name] :
       {std::pair<const char*, std::string>{"tokenizer", m.tokenizer}, {"config", m.config}}) {
    o << "  " << what << ":" << std::string(14 - std::string(what).size(), ' ');
    const std::string state = name.empty() ? "" : file_state(fs::path(dir) / name, -1);
    problems += state == "present" || state.empty() ? 0 : 1;
    o << (name.empty() ? "none saved" : name + " (" + state + ")") << "\n";
  }
  std::cout << o.str() << std::flush;
  if (problems > 0) {
    return report_error(
        Status::corruption(dir + ": " + std::to_string(problems) +
                           " file(s) the manifest names are missing or the wrong size (flagged above)"));
  }
  return 0;
}

int verify(const std::string& arg) {
  const std::string dir = resolve_checkpoint_dir(arg);
  Expected<CheckpointReader> reader = CheckpointReader::open(dir);
  if (!reader) return report_error(reader.status());
  Status st = reader->verify();
  if (!st.is_ok()) return report_error(st);
  const Manifest& m = reader->manifest();
  for (const std::string& name : {m.tokenizer, m.config}) {
    const std::string path = reader->file_path(name);
    std::error_code ec;
    if (!path.empty() && !fs::is_regular_file(path, ec)) {
      return report_error(
          Status::not_found(path + ": missing (the manifest " + reader->manifest_path() + " names it)"));
    }
  }
  std::cout << "OK: " << m.shards.size() << " shard files, " << reader->bytes_read() << " bytes verified (" << dir
            << ")" << std::endl;
  return 0;
}

// --out FILE writes the safetensors file; --out DIR (an existing directory, or a path ending in '/') writes
// DIR/model.safetensors and DIR/config.json, a directory Hugging Face's GPT2LMHeadModel.from_pretrained loads (and
// a GPT-2 BPE tokenizer's vocab.json and merges.txt, for GPT2Tokenizer).
int consolidate(const std::string& arg, const std::string& out) {
  const std::string dir = resolve_checkpoint_dir(arg);
  Expected<CheckpointReader> reader = CheckpointReader::open(dir);
  if (!reader) return report_error(reader.status());
  std::error_code ec;
  const bool to_dir = fs::is_directory(out, ec) || (!out.empty() && out.back() == '/');
  if (!to_dir) {  // one file, written atomically
    const Status st = consolidate_to_safetensors(*reader, out);
    if (!st.is_ok()) return report_error(st);
    std::cout << "wrote " << out << ": " << hf_gpt2_tensors(reader->layout()).size()
              << " tensors with Hugging Face GPT-2 names, " << bytes_text(static_cast<int64_t>(fs::file_size(out, ec)))
              << ", the master weights of step " << reader->manifest().step << " (" << dir << ")" << std::endl;
    return 0;
  }
  // A GPT-2 BPE tokenizer goes along as GPT2Tokenizer's files (char and byte ones have no Hugging Face form).
  std::optional<data::Tokenizer> tokenizer;
  if (const std::string saved = reader->file_path(reader->manifest().tokenizer); !saved.empty()) {
    Expected<data::Tokenizer> tok = data::Tokenizer::load(saved);
    if (!tok) return report_error(tok.status());
    if (tok->bpe_vocab() != nullptr) tokenizer.emplace(std::move(*tok));
  }
  // Tokenizer files in the directory that this export does not write would be read with these weights (import takes
  // tokenizer.json first): refused, unless it is this model's tokenizer (a save_pretrained directory has one).
  std::vector<std::string> foreign = {"tokenizer.json"};
  if (!tokenizer) foreign.insert(foreign.end(), {"vocab.json", "merges.txt"});
  for (const std::string& name : foreign) {
    const std::string path = (fs::path(out) / name).string();
    if (!fs::exists(path, ec)) continue;
    if (name == "tokenizer.json" && tokenizer) {
      Expected<data::Tokenizer> there = data::Tokenizer::load(path);
      if (there && there->same_ids(*tokenizer)) continue;
    }
    return report_error(Status::invalid_argument(
        "--out: " + path + " is there and is not this model's tokenizer" +
        (tokenizer ? "" : " (it has none in Hugging Face's form)") +
        ": checkpoint import would read it with these weights; remove it, or write to another directory"));
  }
  // Each file is written beside its place first and renamed into it once all are written, so that a failure (a file
  // that cannot be replaced, a full disk) leaves a previous export whole: never new weights with an old config.
  struct Output {
    std::string name, text;  // text: "" for the weights
    std::string target, staged;
  };
  std::vector<Output> outputs = {{"model.safetensors", "", "", ""}};
  outputs.push_back({"config.json",
                     hf_gpt2_config_json(reader->manifest().shape,
                                         tokenizer ? std::optional<int32_t>(tokenizer->end_of_text()) : std::nullopt),
                     "", ""});
  if (tokenizer) {
    outputs.push_back({"vocab.json", tokenizer->bpe_vocab()->vocab_json(), "", ""});
    outputs.push_back({"merges.txt", tokenizer->bpe_vocab()->merges_txt(), "", ""});
  }
  for (Output& o : outputs) {
    Expected<std::string> target = atomic_write_target((fs::path(out) / o.name).string());
    if (!target) return report_error(target.status().with_context("--out"));
    o.target = *target;
    o.staged = o.target + ".consolidating";
  }
  const bool created = !fs::exists(out, ec);
  fs::create_directories(out, ec);
  if (ec) return report_error(Status::io_error("--out: cannot create directory '" + out + "': " + ec.message()));
  auto fail = [&](const Status& why) {
    if (created) {
      fs::remove_all(out, ec);
    } else {
      for (const Output& o : outputs) fs::remove(o.staged, ec);
    }
    return report_error(why);
  };
  for (const Output& o : outputs) {
    const Status st = o.text.empty() ? consolidate_to_safetensors(*reader, o.staged)
                                     : write_file_atomically(o.staged, {std::span<const char>(o.text)});
    if (!st.is_ok()) return fail(st);
  }
  for (const Output& o : outputs) {
    fs::rename(o.staged, o.target, ec);
    if (ec) return fail(Status::io_error("--out: cannot rename " + o.staged + " to " + o.target + ": " + ec.message()));
  }
  std::cout << "wrote " << outputs[0].target << ": " << hf_gpt2_tensors(reader->layout()).size()
            << " tensors with Hugging Face GPT-2 names, "
            << bytes_text(static_cast<int64_t>(fs::file_size(outputs[0].target, ec))) << ", the master weights of step "
            << reader->manifest().step << " (" << dir << ")" << std::endl;
  std::cout << "wrote " << outputs[1].target << ": GPT2LMHeadModel.from_pretrained(\"" << out
            << "\") loads the directory" << std::endl;
  if (tokenizer) {
    std::cout << "wrote " << outputs[2].target << " and merges.txt: the tokenizer, which "
              << "GPT2Tokenizer.from_pretrained(\"" << out << "\") loads" << std::endl;
  }
  return 0;
}

int import_hf(const std::string& src, const std::string& out, bool no_tokenizer) {
  std::error_code ec;
  if (fs::exists(out, ec)) {
    return report_error(Status::invalid_argument("--out: '" + out +
                                                 "' already exists (import writes a new model "
                                                 "directory and replaces nothing)"));
  }
  Expected<HfGpt2> hf = read_hf_gpt2(src);
  if (!hf) return report_error(hf.status());
  const GptShape& s = hf->shape;
  // The tokenizer published beside the weights (Hugging Face's tokenizer.json, or vocab.json and merges.txt), so
  // that `sample` takes text; files there that do not read as GPT-2's BPE stop the import (--no-tokenizer skips them).
  fs::path dir = fs::is_directory(src, ec) ? fs::path(src) : fs::path(src).parent_path();
  if (dir.empty()) dir = ".";  // a bare file name
  const bool has_json = fs::exists(dir / "tokenizer.json", ec);
  const bool has_vocab = fs::exists(dir / "vocab.json", ec);
  const bool has_merges = fs::exists(dir / "merges.txt", ec);
  const bool has_openai = fs::exists(dir / "encoder.json", ec) && fs::exists(dir / "vocab.bpe", ec);
  const std::string skip = " (--no-tokenizer imports the weights without it)";
  std::string tokenizer_json;
  if ((has_json || has_vocab || has_merges || has_openai) && !no_tokenizer) {
    if (!has_json && has_vocab != has_merges) {  // (OpenAI's pair, were it there too, is not read then)
      return report_error(Status::invalid_argument((dir / (has_vocab ? "vocab.json" : "merges.txt")).string() +
                                                   " is there without " + (has_vocab ? "merges.txt" : "vocab.json") +
                                                   ": GPT-2's tokenizer needs both" + skip));
    }
    auto tok = data::Tokenizer::load(dir.string());
    if (!tok) return report_error(Status::invalid_argument(tok.status().message() + skip));
    if (has_json && has_vocab && has_merges) {  // save_pretrained writes both forms: they must agree
      auto pair = data::Tokenizer::load_vocab_and_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
      if (!pair || !pair->same_ids(*tok)) {
        return report_error(Status::invalid_argument(
            (dir / "tokenizer.json").string() + " and vocab.json with merges.txt are not one tokenizer" +
            (pair ? std::string(" (they differ)") : " (" + pair.status().message() + ")") + ": remove the stale one" +
            skip));
      }
    }
    if (tok->vocab_size() > s.vocab_size) {
      return report_error(Status::invalid_argument(dir.string() + ": the tokenizer has " +
                                                   std::to_string(tok->vocab_size()) + " tokens, the model's " +
                                                   "vocabulary " + std::to_string(s.vocab_size) + skip));
    }
    tokenizer_json = tok->to_json();
  }
  const Status st = save_model(out, hf->shape, hf->weights.data(), 0, tokenizer_json);
  if (!st.is_ok()) return report_error(st);
  std::cout << "wrote " << out << ": a model directory of " << s.num_params() << " parameters (n_layer " << s.n_layer
            << ", n_head " << s.n_head << ", n_embd " << s.n_embd << ", block_size " << s.block_size << ", vocab_size "
            << s.vocab_size << ") from " << src << "; fine-tune it with checkpoint.init_from (model.* as above), "
            << (tokenizer_json.empty() ? "sample it with --prompt-ids/--ids (no tokenizer beside the weights)"
                                       : "sample it with --prompt (its tokenizer came with it)")
            << std::endl;
  return 0;
}

}  // namespace

Command add_checkpoint_command(CLI::App& app) {
  auto args = std::make_shared<CheckpointArgs>();
  app.require_subcommand(1);
  const char* dir_help = "A checkpoint step directory, a model directory, or a checkpoint root (uses its `latest`)";
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "Print what a checkpoint or model directory holds");
  inspect_cmd->add_option("dir", args->dir, dir_help)->required();
  CLI::App* verify_cmd = app.add_subcommand("verify", "Check every shard file's CRC-32C checksums");
  verify_cmd->add_option("dir", args->dir, dir_help)->required();
  CLI::App* consolidate_cmd =
      app.add_subcommand("consolidate", "Write the fp32 weights as one safetensors file (Hugging Face GPT-2 names)");
  consolidate_cmd->add_option("dir", args->dir, dir_help)->required();
  consolidate_cmd
      ->add_option("--out,-o", args->out,
                   "The .safetensors file to write (atomically), or a directory (existing, or ending in '/') to "
                   "write model.safetensors and Hugging Face's config.json into")
      ->required();
  CLI::App* import_cmd = app.add_subcommand(
      "import",
      "Read Hugging Face GPT-2 weights (config.json + model.safetensors, and the tokenizer's files where they are) "
      "into a new model directory");
  import_cmd
      ->add_option("src", args->dir,
                   "A directory with config.json and model.safetensors (as save_pretrained writes them, e.g. "
                   "OpenAI's GPT-2), or a .safetensors file with config.json beside it")
      ->required();
  import_cmd->add_option("--out,-o", args->out, "The model directory to write (must not exist)")->required();
  import_cmd->add_flag("--no-tokenizer", args->no_tokenizer,
                       "Leave out the tokenizer found beside the weights (tokenizer.json, or vocab.json and "
                       "merges.txt), which is otherwise read as GPT-2's BPE and saved with the model");
  app.footer(
      "Examples:\n"
      "  gpt-train checkpoint inspect runs/shakespeare-char/checkpoints/step_00001000\n"
      "  gpt-train checkpoint verify runs/shakespeare-char/checkpoints        # the step `latest` names\n"
      "  gpt-train checkpoint consolidate runs/shakespeare-char/model --out model.safetensors\n"
      "  gpt-train checkpoint consolidate runs/gpt2-124m/model --out hf/   # + config.json: from_pretrained(\"hf\")\n"
      "  gpt-train checkpoint import gpt2-hf/ --out models/gpt2   # then train with checkpoint.init_from=models/gpt2\n"
      "consolidate maps wte/wpe, h.<i>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj} and ln_f to the\n"
      "names of Hugging Face's GPT2Model; c_attn, c_proj and c_fc weights are stored (in, out) as HF's Conv1D.");
  // Each subcommand's own examples (CLI11 would show gpt-train's).
  inspect_cmd->footer(
      "Examples:\n"
      "  gpt-train checkpoint inspect runs/shakespeare-char/checkpoints/step_00001000\n"
      "  gpt-train checkpoint inspect runs/shakespeare-char/model");
  verify_cmd->footer(
      "Examples:\n"
      "  gpt-train checkpoint verify runs/shakespeare-char/checkpoints        # the step `latest` names\n"
      "  gpt-train checkpoint verify runs/shakespeare-char/checkpoints/step_00001000");
  consolidate_cmd->footer(
      "Examples:\n"
      "  gpt-train checkpoint consolidate runs/shakespeare-char/model --out model.safetensors\n"
      "  gpt-train checkpoint consolidate runs/gpt2-124m/model --out hf/   # + config.json: from_pretrained(\"hf\")\n"
      "wte/wpe, h.<i>.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj} and ln_f get the names of Hugging\n"
      "Face's GPT2Model; c_attn, c_proj and c_fc weights are stored (in, out) as HF's Conv1D.");
  import_cmd->footer(
      "Examples:\n"
      "  gpt-train checkpoint import gpt2-hf/ --out models/gpt2   # then train with checkpoint.init_from=models/gpt2");
  return [args, inspect_cmd, verify_cmd, consolidate_cmd, import_cmd]() -> int {
    if ((consolidate_cmd->parsed() || import_cmd->parsed()) && args->out.empty()) {
      return report_error(Status::invalid_argument("--out is empty: expected a file or directory name"));
    }
    if (inspect_cmd->parsed()) return inspect(args->dir);
    if (verify_cmd->parsed()) return verify(args->dir);
    if (consolidate_cmd->parsed()) return consolidate(args->dir, args->out);
    if (import_cmd->parsed()) return import_hf(args->dir, args->out, args->no_tokenizer);
    return report_error(
        Status::invalid_argument("checkpoint needs a subcommand: inspect, verify, consolidate or import"));
  };
}

}  // namespace gpt
