// The GPU suite's main: without a usable GPU every test is reported as skipped (exit code 77, which
// CTest's SKIP_RETURN_CODE turns into "Skipped"), with the reason printed, never a silent pass.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "sparsejit/device.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::string(argv[i]).rfind("--list", 0) == 0;
  if (!listing && !sjit::gpu_available()) {
    std::printf("SKIPPED: no usable GPU: %s\n", sjit::system_info().no_gpu_reason.c_str());
    return 77;
  }
  // The tests' kernels and tuning results go to folders of their own, never the user's.
  char cache_dir[] = "/tmp/sjit-gpu-tests-cache-XXXXXX", tune_dir[] = "/tmp/sjit-gpu-tests-tune-XXXXXX";
  if (mkdtemp(cache_dir) == nullptr || mkdtemp(tune_dir) == nullptr) return 1;
  setenv("SJIT_CACHE_DIR", cache_dir, 1);
  setenv("SJIT_TUNE_DIR", tune_dir, 1);
  const int result = Catch::Session().run(argc, argv);
  std::system((std::string("rm -rf ") + cache_dir + " " + tune_dir).c_str());
  return result;
}
