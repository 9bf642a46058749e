// sluice make-model: writes a Hugging Face model folder with random weights of a preset's shape.
#include <fmt/core.h>

#include <memory>

#include "cli/command.h"
#include "core/clock.h"
#include "core/units.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string preset = "tiny-mixtral";
  std::string out;
  int layers = 0;
  uint64_t seed = 0;
  std::string shard_size = "4GiB";
};

int run(const Options& o) {
  ModelConfig config = preset_config(o.preset, o.layers);
  auto start = Clock::now();
  WriteStats stats =
      write_random_checkpoint(config, o.out, o.seed, parse_bytes(o.shard_size, "--shard-size"));
  double seconds = seconds_since(start);
  fmt::print("wrote {} ({} layers of {}) to {}: {} in {} file(s), {:.1f} s, {}/s\n", o.preset,
             config.num_layers, config.architecture, o.out, human_bytes(double(stats.bytes)),
             stats.shards, seconds, human_bytes(double(stats.bytes) / seconds));
  return 0;
}

RegisterCommand reg({"make-model", "Write a Hugging Face model folder with random weights",
                     [](CLI::App& sub) {
                       auto o = std::make_shared<Options>();
                       sub.add_option("--preset", o->preset, "Model shape")
                           ->capture_default_str()
                           ->check(CLI::IsMember(preset_names()));
                       sub.add_option("--out", o->out, "Output folder")->required();
                       sub.add_option("--layers", o->layers, "Keep only the first N layers")
                           ->check(CLI::NonNegativeNumber);
                       sub.add_option("--seed", o->seed, "Random seed")->capture_default_str();
                       sub.add_option("--shard-size", o->shard_size, "Largest safetensors file")
                           ->capture_default_str();
                       return std::function<int()>([o] { return run(*o); });
                     }});

}  // namespace
}  // namespace sluice::cli
