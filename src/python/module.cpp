// The Python module `sluice`, in the shape of vLLM's offline API:
//
//   import sluice
//   llm = sluice.LLM("models/moby-moe", threads=2)
//   out = llm.generate(["Call me"], sluice.SamplingParams(temperature=0, max_tokens=20))
//   out[0].outputs[0].text, out[0].outputs[0].token_ids, out[0].outputs[0].finish_reason
//
// The GIL is released while the engine runs; sluice's errors are raised as sluice.Error (a
// RuntimeError) with the same message the command line prints.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "core/error.h"
#include "engine/offline_llm.h"
#include "io/model_chat_template.h"
#include "python/policy_keywords.h"

namespace py = pybind11;

namespace sluice::python {
namespace {

// Python values (lists, dicts in their order, strings, numbers) as JSON, through json.dumps.
nlohmann::ordered_json to_json(const py::handle& value, const char* what) {
  const std::string text = py::module_::import("json")
                               .attr("dumps")(value, py::arg("ensure_ascii") = false)
                               .cast<std::string>();
  auto json = nlohmann::ordered_json::parse(text, nullptr, false);
  if (json.is_discarded()) fail("{}: cannot be written as JSON", what);
  return json;
}

// One conversation (a list of message dicts) or a list of them.
std::vector<nlohmann::ordered_json> conversations_of(const py::handle& value) {
  nlohmann::ordered_json json = to_json(value, "chat: messages");
  if (!json.is_array()) fail("chat: expected a list of messages or a list of conversations");
  if (!json.empty() && json[0].is_object()) return {json};
  std::vector<nlohmann::ordered_json> conversations;
  for (auto& c : json) {
    if (!c.is_array()) fail("chat: expected every conversation to be a list of messages");
    conversations.push_back(std::move(c));
  }
  return conversations;
}

std::vector<std::string> prompts_of(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  return value.cast<std::vector<std::string>>();
}

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0;
};

struct CompletionOutput {
  int index = 0;
  std::string text;
  std::vector<int> token_ids;
  std::string finish_reason;
};

struct RequestOutput {
  std::string request_id;
  std::optional<std::string> prompt;
  std::vector<int> prompt_token_ids;
  std::vector<CompletionOutput> outputs;
  Usage usage;
};

std::vector<RequestOutput> outputs_of(std::vector<GenerationResult> results,
                                      const std::vector<std::string>& prompts) {
  std::vector<RequestOutput> out;
  for (size_t i = 0; i < results.size(); ++i) {
    GenerationResult& r = results[i];
    RequestOutput o;
    o.request_id = std::to_string(i);
    if (!prompts.empty()) o.prompt = prompts[i];
    o.usage = {int(r.prompt_token_ids.size()), int(r.token_ids.size())};
    o.prompt_token_ids = std::move(r.prompt_token_ids);
    o.outputs.push_back({0, std::move(r.text), std::move(r.token_ids), r.finish_reason});
    out.push_back(std::move(o));
  }
  return out;
}

EngineSettings settings_of(const py::kwargs& policy) {
  std::vector<std::pair<std::string, std::string>> keywords;
  for (const auto& [key, value] : policy) {
    keywords.emplace_back(key.cast<std::string>(), py::str(value).cast<std::string>());
  }
  return parse_policy_keywords(keywords);
}

GenerationParams params_or_default(const std::optional<GenerationParams>& params) {
  return params ? *params : GenerationParams{};
}

void bind_results(py::module_& m) {
  py::class_<Usage>(m, "Usage")
      .def_readonly("prompt_tokens", &Usage::prompt_tokens)
      .def_readonly("completion_tokens", &Usage::completion_tokens)
      .def_property_readonly("total_tokens",
                             [](const Usage& u) { return u.prompt_tokens + u.completion_tokens; })
      .def("__repr__", [](const Usage& u) {
        return "Usage(prompt_tokens=" + std::to_string(u.prompt_tokens) +
               ", completion_tokens=" + std::to_string(u.completion_tokens) + ")";
      });
  py::class_<CompletionOutput>(m, "CompletionOutput")
      .def_readonly("index", &CompletionOutput::index)
      .def_readonly("text", &CompletionOutput::text)
      .def_readonly("token_ids", &CompletionOutput::token_ids)
      .def_readonly("finish_reason", &CompletionOutput::finish_reason)
      .def("__repr__", [](const CompletionOutput& o) {
        return "CompletionOutput(text=" + py::repr(py::str(o.text)).cast<std::string>() +
               ", finish_reason='" + o.finish_reason + "')";
      });
  py::class_<RequestOutput>(m, "RequestOutput")
      .def_readonly("request_id", &RequestOutput::request_id)
      .def_readonly("prompt", &RequestOutput::prompt)
      .def_readonly("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_readonly("outputs", &RequestOutput::outputs)
      .def_readonly("usage", &RequestOutput::usage)
      .def_property_readonly("finished", [](const RequestOutput&) { return true; });
}

void bind_sampling_params(py::module_& m) {
  py::class_<GenerationParams>(m, "SamplingParams")
      .def(py::init([](float temperature, float top_p, int top_k, std::optional<uint64_t> seed,
                       int max_tokens, py::object stop) {
             GenerationParams p{temperature, top_p, top_k < 0 ? 0 : top_k, seed, max_tokens, {}};
             if (!stop.is_none()) p.stop = prompts_of(stop);
             return p;
           }),
           py::arg("temperature") = 1.0f, py::arg("top_p") = 1.0f, py::arg("top_k") = 0,
           py::arg("seed") = py::none(), py::arg("max_tokens") = 16, py::arg("stop") = py::none())
      .def_readwrite("temperature", &GenerationParams::temperature)
      .def_readwrite("top_p", &GenerationParams::top_p)
      .def_readwrite("top_k", &GenerationParams::top_k)
      .def_readwrite("seed", &GenerationParams::seed)
      .def_readwrite("max_tokens", &GenerationParams::max_tokens)
      .def_readwrite("stop", &GenerationParams::stop);
}

void bind_llm(py::module_& m) {
  py::class_<OfflineLlm>(m, "LLM")
      .def(py::init([](const std::string& model, const py::kwargs& policy) {
             EngineSettings s = settings_of(policy);
             py::gil_scoped_release unlocked;
             return std::make_unique<OfflineLlm>(model, s.policy, s.device, s.host_memory_bytes);
           }),
           py::arg("model"))
      .def(
          "generate",
          [](OfflineLlm& llm, const py::object& prompts,
             const std::optional<GenerationParams>& params) {
            const std::vector<std::string> texts = prompts_of(prompts);
            std::vector<GenerationResult> results;
            {
              py::gil_scoped_release unlocked;
              results = llm.generate(texts, params_or_default(params));
            }
            return outputs_of(std::move(results), texts);
          },
          py::arg("prompts"), py::arg("sampling_params") = py::none())
      .def(
          "chat",
          [](OfflineLlm& llm, const py::object& messages,
             const std::optional<GenerationParams>& params) {
            const auto conversations = conversations_of(messages);
            std::vector<GenerationResult> results;
            {
              py::gil_scoped_release unlocked;
              results = llm.chat(conversations, params_or_default(params));
            }
            return outputs_of(std::move(results), {});
          },
          py::arg("messages"), py::arg("sampling_params") = py::none());
}

}  // namespace
}  // namespace sluice::python

PYBIND11_MODULE(sluice, m) {
  using namespace sluice::python;
  m.doc() = "sluice: batch inference for Mixture-of-Experts models (vLLM-shaped offline API)";
  py::register_exception<sluice::Error>(m, "Error", PyExc_RuntimeError);
  bind_results(m);
  bind_sampling_params(m);
  bind_llm(m);
  m.def(
      "render_chat_prompt",
      [](const std::string& model, const py::object& messages, const py::object& tools,
         bool add_generation_prompt) {
        const auto json_messages = to_json(messages, "messages");
        const auto json_tools =
            tools.is_none() ? nlohmann::ordered_json() : to_json(tools, "tools");
        py::gil_scoped_release unlocked;
        return sluice::render_chat_prompt(std::filesystem::path(model), json_messages, json_tools,
                                          add_generation_prompt);
      },
      py::arg("model"), py::arg("messages"), py::arg("tools") = py::none(),
      py::arg("add_generation_prompt") = true,
      "The prompt the model's chat template makes (what `sluice chat-template` prints)");
}
