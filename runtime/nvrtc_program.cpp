#include "runtime/nvrtc_program.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "sparsejit/error.h"

namespace sjit::runtime {
namespace {

void check_nvrtc(nvrtcResult result, const char* call) {
  if (result != NVRTC_SUCCESS) throw Error(fmt::format("{} failed: {}", call, nvrtcGetErrorString(result)));
}

struct ProgramDeleter {
  void operator()(nvrtcProgram p) const { nvrtcDestroyProgram(&p); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string program_log(nvrtcProgram prog) {
  size_t size = 0;
  if (nvrtcGetProgramLogSize(prog, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  nvrtcGetProgramLog(prog, log.data());
  log.resize(size - 1);
  return log;
}

// SJIT_LINEINFO=1 compiles kernels with line information, so that compute-sanitizer's reports and
// Nsight Compute's source view name the template's file and line. It changes the NVRTC options, and
// with them the cache key: such binaries never serve a run without it.
bool line_info_asked() {
  const char* env = std::getenv("SJIT_LINEINFO");
  const std::string value = env == nullptr ? "" : env;
  if (value.empty() || value == "0" || value == "off") return false;
  if (value == "1" || value == "on") return true;
  throw InvalidArgument(fmt::format("SJIT_LINEINFO='{}': use 1 or on to compile kernels with line information, "
                                    "0, off or unset for none", value));
}

}  // namespace

std::string cuda_include_dir() {
  if (const char* env = std::getenv("SJIT_CUDA_INCLUDE"); env != nullptr && *env != '\0') return env;
  return SJIT_CUDA_INCLUDE_DIR;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check_nvrtc(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return fmt::format("{}.{}", major, minor);
}

std::vector<std::string> nvrtc_supported_archs() {
  int count = 0;
  check_nvrtc(nvrtcGetNumSupportedArchs(&count), "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(count);
  check_nvrtc(nvrtcGetSupportedArchs(archs.data()), "nvrtcGetSupportedArchs");
  std::vector<std::string> names;
  for (int a : archs) {
    names.push_back(fmt::format("sm_{}", a));
    if (a >= 90) names.push_back(fmt::format("sm_{}a", a));  // arch-specific variants (wgmma, ...)
  }
  return names;
}

std::string validate_arch(const std::string& arch) {
  const auto archs = nvrtc_supported_archs();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end())
    throw InvalidArgument(fmt::format("arch '{}' is not a target of NVRTC {}: use one of {}", arch,
                                      nvrtc_version(), fmt::join(archs, ", ")));
  return arch;
}

std::vector<std::string> nvrtc_options(const CompileRequest& request) {
  const std::string target = request.ptx ? "compute_" + request.arch.substr(3) : request.arch;
  std::vector<std::string> options = {
      "--std=c++17", "--gpu-architecture=" + target, "-default-device",
      "--include-path=" + cuda_include_dir(),
  };
  if (!request.ptx) options.push_back("--ptxas-options=-v");  // resource report in the log
  if (line_info_asked()) options.push_back("--generate-line-info");
  return options;
}

CompileResult nvrtc_compile(const CompileRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const char*> header_texts, header_names;
  for (const auto& h : request.headers) {
    header_texts.push_back(h.text->c_str());
    header_names.push_back(h.name.c_str());
  }
  nvrtcProgram raw = nullptr;
  check_nvrtc(nvrtcCreateProgram(&raw, request.source.c_str(), request.source_name.c_str(), int(header_texts.size()),
                                 header_texts.data(), header_names.data()),
              "nvrtcCreateProgram");
  Program prog(raw);
  check_nvrtc(nvrtcAddNameExpression(raw, request.name_expression.c_str()), "nvrtcAddNameExpression");

  CompileResult result;
  result.options = nvrtc_options(request);
  std::vector<const char*> argv;
  for (const auto& o : result.options) argv.push_back(o.c_str());
  const nvrtcResult compiled = nvrtcCompileProgram(raw, int(argv.size()), argv.data());
  result.log = program_log(raw);
  if (compiled != NVRTC_SUCCESS) {
    throw CompileError(fmt::format("NVRTC could not compile {} for {} ({}):\n{}\n--- generated source ---\n{}",
                                   request.source_name, request.arch, nvrtcGetErrorString(compiled), result.log,
                                   request.source),
                       result.log, request.source);
  }
  const char* lowered = nullptr;
  check_nvrtc(nvrtcGetLoweredName(raw, request.name_expression.c_str(), &lowered), "nvrtcGetLoweredName");
  result.lowered_name = lowered;

  size_t size = 0;
  if (request.ptx) {
    check_nvrtc(nvrtcGetPTXSize(raw, &size), "nvrtcGetPTXSize");
    result.binary.resize(size);
    check_nvrtc(nvrtcGetPTX(raw, result.binary.data()), "nvrtcGetPTX");
    if (!result.binary.empty() && result.binary.back() == '\0') result.binary.pop_back();
  } else {
    check_nvrtc(nvrtcGetCUBINSize(raw, &size), "nvrtcGetCUBINSize");
    result.binary.resize(size);
    check_nvrtc(nvrtcGetCUBIN(raw, result.binary.data()), "nvrtcGetCUBIN");
  }
  result.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace sjit::runtime
