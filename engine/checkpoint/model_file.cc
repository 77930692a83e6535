#include "checkpoint/model_file.h"

#include <filesystem>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"

namespace gpt {

namespace fs = std::filesystem;

Status save_model(const std::string& dir, const GptShape& shape, const float* weights, int64_t step,
                  const std::string& tokenizer_json) {
  const ModelLayout layout = ModelLayout::build(shape);
  SaveRequest req;
  req.manifest.kind = "model";
  req.manifest.step = step;
  req.manifest.shape = shape;
  req.sections = {weights};
  int64_t offset = 0;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    req.slices.push_back({static_cast<int>(u), 0, layout.units[u].numel, offset});
    offset += layout.units[u].numel;
  }
  req.tokenizer_json = tokenizer_json;
  req.update_latest = false;
  req.manage_root = false;  // the parent is the user's: nothing else in it is touched
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  auto single = make_single_communicator();
  return save_checkpoint(*single, path.parent_path().empty() ? "." : path.parent_path().string(),
                         path.filename().string(), req);
}

Expected<SavedModel> load_model(const std::string& dir) {
  GPT_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::open(dir));
  SavedModel out;
  out.shape = reader.manifest().shape;
  out.step = reader.manifest().step;
  out.weights.resize(static_cast<size_t>(reader.layout().total_numel));
  int64_t offset = 0;
  for (size_t u = 0; u < reader.layout().units.size(); ++u) {
    const int64_t n = reader.layout().units[u].numel;
    GPT_RETURN_IF_ERROR(reader.read("master", static_cast<int>(u), 0, n, out.weights.data() + offset));
    offset += n;
  }
  out.tokenizer_path = reader.file_path(reader.manifest().tokenizer);
  return out;
}

}  // namespace gpt
