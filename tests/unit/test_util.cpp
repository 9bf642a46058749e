#include "test_util.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

namespace sluice::testing {

CommandResult run_command(const std::string& command, bool with_stderr) {
  CommandResult result;
  std::FILE* pipe = popen((with_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

void rewrite_checkpoint(const std::filesystem::path& dir,
                        const std::function<bool(TensorSpec&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path file = dir / "model.safetensors", old = dir / "old.safetensors.bak";
  fs::rename(file, old);
  std::vector<TensorSpec> specs;
  std::vector<const TensorEntry*> sources;
  {
    const SafetensorsFile in = SafetensorsFile::open(old);
    for (const auto& [name, entry] : in.tensors()) {
      TensorSpec s{name, entry.dtype, entry.shape};
      if (!edit(s)) continue;
      specs.push_back(s);
      sources.push_back(&entry);
    }
    SafetensorsWriter out(file, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      const size_t bytes = size_t(shape_numel(specs[i].shape)) * dtype_size(specs[i].dtype);
      if (bytes == sources[i]->nbytes) {
        out.write(sources[i]->file->data() + sources[i]->offset, bytes);
      } else {
        const std::vector<char> zeros(bytes);
        out.write(zeros.data(), bytes);
      }
    }
    out.finish();
  }
  fs::remove(old);
}

void edit_config(const std::filesystem::path& dir,
                 const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  edit(j);
  std::ofstream(dir / "config.json") << j.dump(2);
}

}  // namespace sluice::testing
