#include "parsers.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <variant>

#include "core/tensor.h"
#include "io/batch_format.h"
#include "io/chat_template.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "server/completion_request.h"

namespace sluice::fuzz {

namespace {

// Reads the first and last byte of a range a parser accepted, so ASan sees a range that leaves
// the mapping or the image.
void touch(const void* data, size_t nbytes) {
  if (nbytes == 0) return;
  volatile uint8_t first = static_cast<const uint8_t*>(data)[0];
  volatile uint8_t last = static_cast<const uint8_t*>(data)[nbytes - 1];
  (void)first;
  (void)last;
}

std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A safetensors file: the 8-byte header length, the JSON header, the tensor data.
void safetensors_header(const uint8_t* data, size_t size) {
  const auto path = write_input(data, size, "model.safetensors");
  expect_success_or_error([&] {
    auto file = SafetensorsFile::open(path);
    for (const auto& [name, entry] : file.tensors()) touch(entry.view().data, entry.nbytes);
  });
}

void write_valid_shards() {
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    const auto path = input_dir() / shard;
    if (std::filesystem::exists(path)) continue;
    const std::string tensor = std::string(shard).find("00001") != std::string::npos ? "a" : "b";
    SafetensorsWriter writer(path, {{tensor, DType::F32, {2}}});
    const float values[2] = {1.0f, 2.0f};
    writer.write(values, sizeof(values));
    writer.finish();
  }
}

// A sharded checkpoint's model.safetensors.index.json, beside two valid shards.
void safetensors_index(const uint8_t* data, size_t size) {
  write_valid_shards();
  write_input(data, size, "model.safetensors.index.json");
  expect_success_or_error([&] {
    auto checkpoint = Checkpoint::open(input_dir());
    for (const auto& [name, entry] : checkpoint.tensors()) touch(entry.view().data, entry.nbytes);
  });
  std::filesystem::remove(input_dir() / "model.safetensors.index.json");
}

// A model's config.json, through the loader that picks the family and checks every field.
void config(const uint8_t* data, size_t size) {
  const auto path = write_input(data, size, "config.json");
  expect_success_or_error([&] {
    ModelConfig c = load_config(path);
    (void)config_to_json(c);
    (void)rope_inv_freq(c);
  });
}

// A tokenizer file, loaded as `sluice tokenize --tokenizer` loads it (the format chosen by the
// file's name), then used.
void tokenizer_file(const uint8_t* data, size_t size, const char* file_name) {
  const auto path = write_input(data, size, file_name);
  expect_success_or_error([&] { exercise_tokenizer(*Tokenizer::load(path)); });
}
void tokenizer_json(const uint8_t* data, size_t size) {
  tokenizer_file(data, size, "tokenizer.json");
}
void sentencepiece(const uint8_t* data, size_t size) {
  tokenizer_file(data, size, "tokenizer.model");
}
// Named as a file whose split pattern sluice knows: any other name is refused before its lines
// are read (the target fuzzed only that refusal when it wrote vocab.tiktoken).
void tiktoken(const uint8_t* data, size_t size) {
  tokenizer_file(data, size, "cl100k_base.tiktoken");
}

// A GGUF file: header, typed metadata, tensor infos; then its vocabulary as a tokenizer.
void gguf(const uint8_t* data, size_t size) {
  expect_success_or_error([&] {
    auto file = GgufFile::parse_image(reinterpret_cast<const std::byte*>(data), size, "fuzz.gguf");
    for (const auto& [name, info] : file.tensors()) touch(info.data(), info.nbytes);
  });
  tokenizer_file(data, size, "model.gguf");
}

nlohmann::ordered_json conversation() {
  using ojson = nlohmann::ordered_json;
  ojson call = {{"type", "function"}, {"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}};
  return ojson::array({{{"role", "system"}, {"content", "be brief"}},
                       {{"role", "user"}, {"content", "héllo"}},
                       {{"role", "assistant"}, {"content", "ok"}, {"tool_calls", {call}}},
                       {{"role", "tool"}, {"content", "42"}},
                       {{"role", "user"}, {"content", "more"}}});
}

// A chat template (Jinja): lexed, parsed and rendered over a conversation with tool calls; the
// renderer's limits on steps, recursion and output size bound every run.
void jinja(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = conversation();
  expect_success_or_error([&] {
    auto tmpl = ChatTemplate::parse(std::string(as_text(data, size)), "fuzz.jinja");
    (void)tmpl.render(messages, true);
  });
}

// One line of a JSONL batch file (`sluice run --input`), and one line of a results file as the
// resume reads it. Bad lines become error records, so nothing may throw at all.
void batch_line(const uint8_t* data, size_t size) {
  const std::string_view line = as_text(data, size);
  BatchLine parsed = parse_batch_line(line, 1);
  if (parsed.request) (void)parsed.request->messages.dump();
  (void)format_batch_error(parsed.custom_id, parsed.error_code, parsed.error_message);
  (void)read_result_line(line);
}

// The shipped model as `sluice serve` serves it: its config, tokenizer and chat template.
struct ServedMoby {
  ModelConfig config = load_config(SLUICE_SOURCE_DIR "/models/moby-moe/config.json");
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(SLUICE_SOURCE_DIR "/models/moby-moe");
  ChatPrompter prompter = ChatPrompter::load(SLUICE_SOURCE_DIR "/models/moby-moe", *tokenizer);
  server::ServedModel served{&config, tokenizer.get(), &prompter, ""};
};

// The body of a /v1/completions (first byte even) or /v1/chat/completions (odd) request, as the
// server parses it into the engine's request; any exception is a bug (the server would answer
// 500), so none is caught. The stop strings, where given, are then checked over the prompt's
// tokens.
void server_request(const uint8_t* data, size_t size) {
  static const ServedMoby moby;
  if (size == 0) return;
  auto parsed = server::parse_completion(as_text(data + 1, size - 1), (data[0] & 1) != 0,
                                         moby.served, 256, 1);
  auto* r = std::get_if<server::CompletionRequest>(&parsed);
  if (r && r->request.stop_check) (void)r->request.stop_check(r->request.prompt);
}

constexpr ParserTarget kTargets[] = {
    {"safetensors_header", safetensors_header},
    {"safetensors_index", safetensors_index},
    {"config", config},
    {"tokenizer_json", tokenizer_json},
    {"sentencepiece", sentencepiece},
    {"tiktoken", tiktoken},
    {"gguf", gguf},
    {"jinja", jinja},
    {"batch_line", batch_line},
    {"server_request", server_request},
};

}  // namespace

std::span<const ParserTarget> parser_targets() {
  return kTargets;
}

const ParserTarget& parser_target(std::string_view name) {
  for (const ParserTarget& t : kTargets)
    if (name == t.name) return t;
  std::fprintf(stderr, "no fuzz target named %.*s\n", int(name.size()), name.data());
  std::abort();
}

}  // namespace sluice::fuzz
