#include <xxhash.h>

#include "codegen/embedded_templates.h"

namespace sjit::codegen {

std::vector<runtime::InMemoryHeader> template_headers() {
  std::vector<runtime::InMemoryHeader> headers;
  for (const auto& t : embedded_templates()) headers.push_back({t.name, &t.text});
  return headers;
}

std::uint64_t templates_hash() {
  static const std::uint64_t hash = [] {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const auto& t : embedded_templates()) {
      XXH3_64bits_update(state, t.name.data(), t.name.size() + 1);  // with the NUL: names and texts can't blur
      XXH3_64bits_update(state, t.text.data(), t.text.size() + 1);
    }
    const std::uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return h;
  }();
  return hash;
}

}  // namespace sjit::codegen
