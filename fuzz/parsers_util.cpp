#include "parsers.h"

#include <unistd.h>

#include <fstream>
#include <vector>

#include "io/tokenizer.h"

namespace sluice::fuzz {

// The inputs' folder, one per process, removed when the process exits normally.
const std::filesystem::path& input_dir() {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("sluice-fuzz-" + std::to_string(getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::filesystem::path write_input(const uint8_t* data, size_t size, const std::string& name) {
  const auto path = input_dir() / name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

void exercise_tokenizer(const Tokenizer& tokenizer) {
  for (std::string_view text : {"Hello, world! 123", " \n\t <s></s> café 日本語 🙂", ""}) {
    std::vector<int32_t> ids = tokenizer.encode(text, true);
    (void)tokenizer.decode(ids, false);
    (void)tokenizer.decode(ids, true);
  }
  const int n = tokenizer.vocab_size();
  std::vector<int32_t> all;
  for (int32_t id = 0; id < n && id < 512; ++id) all.push_back(id);
  all.push_back(-1);
  all.push_back(n);
  (void)tokenizer.decode(all, false);
  for (int32_t id : {0, n - 1, n, -1}) (void)tokenizer.token_text(id);
}

}  // namespace sluice::fuzz
