// SJIT_RECORD=FILE: every kernel key a process asks for is appended to FILE once, in the format
// `sjit warmup` reads, so that a deployment can warm its cache with exactly what it uses.
#pragma once

#include <string>

namespace sjit::cache {

// Appends `kernel_key` to $SJIT_RECORD unless the file already holds it. Never throws: a failure to
// write prints one warning.
void record_request(const std::string& kernel_key);

}  // namespace sjit::cache
