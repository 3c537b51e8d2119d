// The kernel templates of templates/, embedded in the library at build time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/nvrtc_program.h"

namespace sjit::codegen {

struct EmbeddedTemplate {
  std::string name;  // path below templates/, e.g. "sparsejit/rownorm.cuh"
  std::string text;
};

const std::vector<EmbeddedTemplate>& embedded_templates();  // defined in the generated source

// Every template as an NVRTC in-memory header (all are passed: a unit may include any of them).
std::vector<runtime::InMemoryHeader> template_headers();

// XXH3-64 over every template's name and text: part of every cache key, so editing a template
// invalidates every binary built from the old text.
std::uint64_t templates_hash();

// 16 hex digits of a SHA-256 over the sources that generate the kernels and choose among them
// (src/codegen, src/attention, src/spec), taken at build time (defined in a generated source). A change
// there (a default tiling, a rule) may change what a stored tuning measured, as a template's may.
std::string_view kernel_choices_fingerprint();

}  // namespace sjit::codegen
