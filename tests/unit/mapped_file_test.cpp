// The mapping helpers behind reading weights into 2 MiB pages (engine/weights_in_memory.cpp):
// this process's mappings of a file as /proc/self/smaps reports them, and dropping a file's pages.
#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "test_util.h"

namespace sluice {
namespace {

using testing::TempDir;

constexpr size_t kFileBytes = size_t(8) << 20;

std::filesystem::path write_file(const TempDir& dir) {
  const std::filesystem::path path = dir.path() / "weights.bin";
  std::ofstream out(path, std::ios::binary);
  const std::string chunk(size_t(1) << 20, 'w');
  for (size_t i = 0; i < kFileBytes / chunk.size(); ++i) out.write(chunk.data(), chunk.size());
  return path;
}

size_t resident(const std::vector<FileMapping>& maps) {
  size_t bytes = 0;
  for (const FileMapping& m : maps) bytes += m.resident;
  return bytes;
}

TEST(MappedFile, MappingsOfAFileAreFoundWithWhatTheyHoldResident) {
  TempDir dir;
  const auto path = write_file(dir);
  EXPECT_TRUE(file_mappings(path).empty()) << "not mapped yet";
  const auto file = MappedFile::open(path);
  read_into_memory(file->data(), file->size(), path);
  const std::vector<FileMapping> maps = file_mappings(path);
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].begin, reinterpret_cast<uintptr_t>(file->data()));
  EXPECT_EQ(maps[0].end - maps[0].begin, kFileBytes);
  EXPECT_EQ(maps[0].resident, kFileBytes);
  EXPECT_LE(maps[0].in_huge_pages, maps[0].resident);
  // A path naming the same file another way finds the same mapping.
  EXPECT_EQ(file_mappings(dir.path() / "." / "weights.bin").size(), 1u);
}

TEST(MappedFile, DroppedPagesComeBackWithTheSameBytes) {
  TempDir dir;
  const auto path = write_file(dir);
  const auto file = MappedFile::open(path);
  read_into_memory(file->data(), file->size(), path);
  drop_from_page_cache(path, file_mappings(path));
  EXPECT_EQ(resident(file_mappings(path)), 0u) << "the mapping still holds pages";
  read_into_memory(file->data(), file->size(), path);
  EXPECT_EQ(resident(file_mappings(path)), kFileBytes);
  for (size_t i = 0; i < kFileBytes; i += 4096) ASSERT_EQ(char(file->data()[i]), 'w') << i;
}

}  // namespace
}  // namespace sluice
