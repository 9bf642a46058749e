#include "model/family.h"

#include "core/error.h"

namespace sluice {

std::span<const FamilySpec* const> all_families() {
  static const FamilySpec* const families[] = {
      &mixtral_family(), &qwen3_moe_family(),   &olmoe_family(),      &qwen2_moe_family(),
      &dbrx_family(),    &deepseek_v2_family(), &deepseek_v3_family()};
  return families;
}

const FamilySpec& family_spec(Family f) {
  for (const FamilySpec* spec : all_families())
    if (spec->family == f) return *spec;
  fail("family {} has no description in family.cpp", int(f));
}

const FamilySpec* family_of_gguf(const GgufFile& g, std::string_view arch) {
  for (const FamilySpec* spec : all_families())
    if (spec->gguf && spec->gguf->arch == arch && (!spec->gguf->reads || spec->gguf->reads(g)))
      return spec;
  return nullptr;
}

}  // namespace sluice
