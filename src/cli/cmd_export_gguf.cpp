// sluice export-gguf: writes a Hugging Face model folder as a GGUF file (llama.cpp's format),
// tensor by tensor in bounded memory (model/gguf_export.h).
#include <fmt/core.h>

#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "core/clock.h"
#include "core/units.h"
#include "io/gguf.h"
#include "model/gguf_export.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model, out, type = "q8_0";
  int parts = 1;
};

int run(const Options& o) {
  const GgufWeights weights = parse_gguf_weights(o.type, "--type");
  const auto start = Clock::now();
  const std::filesystem::path first = export_gguf(o.model, o.out, weights, o.parts);
  const double seconds = seconds_since(start);
  // Read back, which also checks what was written.
  const GgufFile g = GgufFile::open(first);
  uintmax_t bytes = 0;
  for (const auto& part : g.parts()) bytes += std::filesystem::file_size(part);
  fmt::print("wrote {} as {}: {} tensors, matrices in {}, {} in {} file(s), {:.1f} s, {}/s\n",
             o.model, first.string(), g.tensors().size(), gguf_weights_name(weights),
             human_bytes(double(bytes)), g.parts().size(), seconds,
             human_bytes(double(bytes) / seconds));
  return 0;
}

RegisterCommand reg({"export-gguf", "Write a model folder as a GGUF file (llama.cpp's format)",
                     [](CLI::App& sub) {
                       auto o = std::make_shared<Options>();
                       sub.add_option("--model", o->model, "Model folder")->required();
                       sub.add_option("--out", o->out, "Output file (.gguf)")->required();
                       sub.add_option("--type", o->type, "Matrices in f32, bf16, q8_0 or q4_0")
                           ->capture_default_str();
                       sub.add_option("--split", o->parts, "Write N split files")
                           ->capture_default_str()
                           ->check(CLI::Range(1, 99999));
                       return std::function<int()>([o] { return run(*o); });
                     }});

}  // namespace
}  // namespace sluice::cli
