// sluice quantize: writes a copy of a model folder whose expert weights are int8 or int4 with
// group-wise scales (README.md, "Quantized checkpoints"), tensor by tensor in bounded memory.
#include <fmt/core.h>

#include <memory>

#include "cli/command.h"
#include "cli/policy_options.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/units.h"
#include "model/expert_quant.h"
#include "model/quantize_checkpoint.h"

namespace sluice::cli {
namespace {

struct Options {
  std::string model, out;
  ExpertDtype dtype = ExpertDtype::kBf16;
  int group = 0;
};

int run(const Options& o) {
  const auto start = Clock::now();
  const QuantizeStats s = quantize_checkpoint(o.model, o.out, o.dtype, o.group);
  const double seconds = seconds_since(start);
  fmt::print("quantized {} expert matrices to {} (group {}): {} -> {} in {:.1f} s, wrote {}\n",
             s.matrices, expert_dtype_name(o.dtype), s.group_size, human_bytes(double(s.bytes_in)),
             human_bytes(double(s.bytes_out)), seconds, o.out);
  return 0;
}

RegisterCommand reg({"quantize", "Write a copy of a model folder with int8 or int4 expert weights",
                     [](CLI::App& sub) {
                       auto o = std::make_shared<Options>();
                       sub.add_option("--model", o->model, "Model folder (bf16)")->required();
                       sub.add_option("--out", o->out, "Output folder")->required();
                       add_expert_dtype_options(sub, o->dtype, o->group, "Quantization");
                       sub.get_option("--expert-dtype")->required();
                       return std::function<int()>([o] { return run(*o); });
                     }});

}  // namespace
}  // namespace sluice::cli
