// The disk cache seen from the JIT: processes and threads sharing it, recording, warm-up files and
// the `sjit warmup` command. Every test uses its own cache folder.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>

#include "sparsejit/sparsejit.h"
#include "support/temp_dir.h"

using namespace sjit;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh cache folder made the process cache for the life of the object.
struct TempCache {
  test::TempDir folder{"sjit-test-"};
  fs::path dir = folder.path();
  TempCache() { set_cache_settings({dir.string(), CacheMode::rw, 1ull << 30}); }
  std::size_t count(const std::string& extension) const {
    std::size_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == extension;
    return n;
  }
  std::size_t stray_files() const {  // anything that is neither a binary nor a record (temporary files)
    return test::count_stray_files(test::files_under(dir), {".bin", ".json"});
  }
};

// A spec no other test compiles, so that the cache starts empty of it.
std::string fresh_key() {
  std::mt19937 rng(std::random_device{}());
  return fmt::format("rownorm:kind=entmax,alpha={},n=24,dtype=f32,pass=fwd", 1.1 + 0.8 * std::uniform_real_distribution<>(0, 1)(rng));
}

std::string run_tool(const std::string& args, int* status) {
  FILE* pipe = popen(fmt::format("'{}' {} 2>&1", SJIT_TOOL_PATH, args).c_str(), "r");
  std::string out;
  char buf[4096];
  for (std::size_t got; (got = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, got);
  const int raw = pclose(pipe);
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return out;
}

}  // namespace

TEST_CASE("a second compile of a kernel is read from the disk cache", "[cache][jit]") {
  TempCache cache;
  const std::string key = fresh_key();
  const CompiledKernel first = compile_key(key, "sm_90a");
  const CompiledKernel second = compile_key(key, "sm_90a");
  CHECK_FALSE(first.from_cache);
  CHECK(second.from_cache);
  CHECK(second.binary == first.binary);
  CHECK(second.lowered_name == first.lowered_name);
  CHECK(second.usage.registers == first.usage.registers);
  CHECK(cache.count(".bin") == 1);
  // Another arch is another entry.
  CHECK_FALSE(compile_key(key, "sm_80").from_cache);
  CHECK(cache.count(".bin") == 2);
}

TEST_CASE("eight processes compiling one spec into an empty cache all succeed, one entry remains", "[cache][jit]") {
  TempCache cache;
  const std::string key = fresh_key();
  test::run_child_processes(8, [&](int) {  // each exits 0 when it got a CUBIN
    set_cache_settings({cache.dir.string(), CacheMode::rw, 1ull << 30});
    const CompiledKernel k = compile_key(key, "sm_90a");
    return k.binary.compare(0, 4, "\x7f" "ELF") == 0 ? 0 : 2;
  });
  CHECK(cache.count(".bin") == 1);
  CHECK(cache.count(".json") == 1);
  CHECK(cache.stray_files() == 0);
  CHECK(compile_key(key, "sm_90a").from_cache);
}

TEST_CASE("threads racing on one spec all get the same binary", "[cache][jit]") {
  TempCache cache;
  const std::string key = fresh_key();
  std::vector<std::future<CompiledKernel>> results;
  for (int i = 0; i < 8; ++i) results.push_back(std::async(std::launch::async, [&] { return compile_key(key, "sm_90a"); }));
  std::vector<CompiledKernel> got;
  for (auto& r : results) got.push_back(r.get());
  for (const auto& k : got) CHECK(k.binary == got[0].binary);
  CHECK(cache.count(".bin") == 1);
  CHECK(cache.stray_files() == 0);
}

TEST_CASE("an unwritable cache folder degrades to no disk cache, never to an error", "[cache][jit]") {
  TempCache cache;
  set_cache_settings({(cache.dir / "ro").string(), CacheMode::ro, 1ull << 30});
  const std::string key = fresh_key();
  CHECK_NOTHROW(compile_key(key, "sm_90a"));
  CHECK_FALSE(compile_key(key, "sm_90a").from_cache);  // ro: nothing was written
  CHECK_FALSE(fs::exists(cache.dir / "ro" / "v1"));
}

TEST_CASE("SJIT_RECORD appends each kernel asked for once, in the warm-up format", "[cache][record]") {
  TempCache cache;
  const fs::path record = cache.dir / "recorded.txt";
  setenv("SJIT_RECORD", record.c_str(), 1);
  const std::string a = fresh_key(), b = "rownorm:kind=softmax,n=48,dtype=bf16,pass=bwd";
  compile_key(a, "sm_90a");
  compile_key(b, "sm_90a");
  compile_key(a, "sm_80");  // the same kernel for another arch: still one line
  unsetenv("SJIT_RECORD");
  const auto requests = read_warmup_file(record.string());
  REQUIRE(requests.size() == 2);
  CHECK(requests[0].key.rfind(key(parse_rownorm(a)) + "|", 0) == 0);  // kernel keys: spec | layout
  CHECK(requests[1].key.rfind(key(parse_rownorm(b)) + "|", 0) == 0);
}

TEST_CASE("a warm-up file with a bad line is refused, naming the line", "[cache][warmup]") {
  TempCache cache;
  const fs::path file = cache.dir / "specs.txt";
  std::ofstream(file) << "# kernels\nrownorm:kind=softmax,n=8\n\nrownorm:kind=entmax,n=8   # no alpha\n";
  CHECK_THROWS_WITH(read_warmup_file(file.string()), Contains("specs.txt:4") && Contains("alpha"));
  CHECK_THROWS_WITH(read_warmup_file((cache.dir / "absent.txt").string()), Contains("absent.txt"));
}

TEST_CASE("sjit warmup twice: the second run compiles nothing", "[cache][warmup][tool]") {
  TempCache cache;
  const fs::path file = cache.dir / "specs.txt";
  {
    std::ofstream out(file);
    out << "# two archs x three kernels\n" << fresh_key() << "\nrownorm:kind=sparsemax,n=40|tpr=4\n"
        << "rownorm:kind=softmax,n=72,dtype=f16,pass=bwd\n";
  }
  const std::string args = fmt::format("warmup '{}' --arch sm_80,sm_90a --jobs 2", file.string());
  setenv("SJIT_CACHE_DIR", cache.dir.c_str(), 1);
  int status = -1;
  const std::string first = run_tool(args, &status);
  CHECK(status == 0);
  CHECK_THAT(first, Contains("warmup: compiled 6, already cached 0, failed 0"));
  const std::string second = run_tool(args, &status);
  unsetenv("SJIT_CACHE_DIR");
  CHECK(status == 0);
  CHECK_THAT(second, Contains("warmup: compiled 0, already cached 6, failed 0"));
  INFO(first << "\n" << second);
}

TEST_CASE("sjit warmup with a failing line exits non-zero and names it", "[cache][warmup][tool]") {
  TempCache cache;
  const fs::path file = cache.dir / "bad.txt";
  std::ofstream(file) << "rownorm:kind=softmax,n=8\nrownorm:kind=softmax,n=8,colour=red\n";
  setenv("SJIT_CACHE_DIR", cache.dir.c_str(), 1);
  int status = 0;
  const std::string out = run_tool(fmt::format("warmup '{}' --arch sm_90a", file.string()), &status);
  unsetenv("SJIT_CACHE_DIR");
  CHECK(status != 0);
  CHECK_THAT(out, Contains("bad.txt:2") && Contains("colour"));
}

TEST_CASE("one kernel compiles to the same bytes in every process", "[cache][jit]") {
  // Content addressing needs it: a symbol with a per-compile random name once made CUBINs differ.
  TempCache cache;
  const std::string key = fresh_key();
  std::vector<std::string> binaries;
  for (int i = 0; i < 2; ++i) {
    const fs::path out = cache.dir / fmt::format("k{}.cubin", i);
    int status = -1;
    setenv("SJIT_CACHE", "off", 1);
    run_tool(fmt::format("compile '{}' --arch sm_90a --emit cubin -o '{}'", key, out.string()), &status);
    unsetenv("SJIT_CACHE");
    REQUIRE(status == 0);
    std::ifstream in(out, std::ios::binary);
    binaries.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  CHECK(binaries[0].size() > 1000);
  CHECK(binaries[0] == binaries[1]);
}
