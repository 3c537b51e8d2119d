// The persistent kernel cache on disk: round trips, refusal of bad and foreign entries, races between
// processes and threads, unwritable folders, eviction and the maintenance commands. Entries are
// synthetic (random bytes, metadata by hand): NVRTC plays no part here.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "cache/disk_cache.h"
#include "sparsejit/error.h"
#include "support/temp_dir.h"
#include "support/test_support.h"

using namespace sjit;
using namespace sjit::cache;
namespace fs = std::filesystem;

namespace {

using test::can_write_into;
using test::file_names_under;
using test::make_tree_read_only;
using test::read_file;
using test::stderr_of;
using test::write_file;

// A fresh folder for one test, removed at the end.
struct TemporaryFolder : test::TempDir {
  TemporaryFolder() : TempDir("sjit-cache-test-") {}
};

std::mt19937_64& rng() {
  static std::mt19937_64 generator(test::fresh_seed());
  return generator;
}

std::string random_binary(std::size_t bytes) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::string out(bytes, '\0');
  for (char& c : out) c = static_cast<char>(byte(rng()));
  return out;
}

std::string random_digest() {
  std::string digest;
  for (int i = 0; i < 32; ++i) digest += "0123456789abcdef"[rng()() % 16];
  return digest;
}

Entry make_entry(const std::string& key_text, std::size_t binary_bytes = 4096) {
  Entry entry;
  entry.meta.key_text = key_text;
  entry.meta.arch = "sm_90a";
  entry.meta.emit = "cubin";
  entry.meta.nvrtc_version = "13.0";
  entry.meta.library_version = "0.1.0";
  entry.meta.options = {"--std=c++17", "--gpu-architecture=sm_90a", "-default-device"};
  entry.meta.lowered_name = "_Z6rownormILi64EEvPKfPfi";
  entry.meta.compile_ms = 125.5;
  entry.meta.log = "ptxas info    : Used 32 registers\n";
  entry.binary = random_binary(binary_bytes);
  return entry;
}

// What a process of this library and NVRTC expects from an entry it loads.
EntryMeta expected_for(const Entry& entry) {
  EntryMeta expected;
  expected.arch = entry.meta.arch;
  expected.emit = entry.meta.emit;
  expected.nvrtc_version = entry.meta.nvrtc_version;
  expected.library_version = entry.meta.library_version;
  return expected;
}

Settings settings_for(const fs::path& root, Mode mode = Mode::rw, std::uint64_t max_bytes = 2ull << 30) {
  Settings settings;
  settings.root = root;
  settings.mode = mode;
  settings.max_bytes = max_bytes;
  return settings;
}

fs::path binary_path(const fs::path& root, const std::string& digest, const std::string& arch = "sm_90a") {
  return root / "v1" / arch / digest.substr(0, 2) / (digest + ".bin");
}
fs::path record_path(const fs::path& root, const std::string& digest, const std::string& arch = "sm_90a") {
  return root / "v1" / arch / digest.substr(0, 2) / (digest + ".json");
}

// Sets a file's mtime `age` into the past: what it looks like after that long untouched.
void age_file(const fs::path& path, std::chrono::seconds age) {
  fs::last_write_time(path, fs::file_time_type::clock::now() - age);
}

int count_with_suffix(const std::vector<std::string>& names, const std::string& suffix) {
  return static_cast<int>(
      std::count_if(names.begin(), names.end(), [&](const std::string& n) { return n.ends_with(suffix); }));
}

// A load that found what was stored.
bool same_entry(const std::optional<Entry>& got, const Entry& stored) {
  return got && got->binary == stored.binary && got->meta.key_text == stored.meta.key_text &&
         got->meta.lowered_name == stored.meta.lowered_name && got->meta.size == stored.binary.size();
}

// Wait long enough that the file system's clock (coarse: a few milliseconds) ticks between two uses.
void let_the_clock_tick() { std::this_thread::sleep_for(std::chrono::milliseconds(30)); }

// Binaries that differ in 8 bytes, as NVRTC's output for one unit can from one compile to the next.
std::vector<std::string> compile_variants(const std::string& binary, int count) {
  std::vector<std::string> variants;
  for (int v = 0; v < count; ++v) {
    variants.push_back(binary);
    for (int i = 0; i < 8; ++i) variants.back()[2048 + i] = static_cast<char>(v * 8 + i);
  }
  return variants;
}

// A verified load of one of `variants`, with the metadata they were stored with.
bool one_of(const std::optional<Entry>& got, const std::vector<std::string>& variants, const Entry& stored) {
  return got && std::find(variants.begin(), variants.end(), got->binary) != variants.end() &&
         got->meta.key_text == stored.meta.key_text && got->meta.lowered_name == stored.meta.lowered_name;
}

// The cache's environment variables, put back at the end of a test.
sjit::test::EnvironmentGuard cache_environment() {
  return sjit::test::EnvironmentGuard({"SJIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "SJIT_CACHE", "SJIT_CACHE_MAX_SIZE"});
}

}  // namespace

TEST_CASE("a stored entry loads back with every field", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "not-yet" / "cache";  // store creates it
  DiskCache cache(settings_for(root));
  const std::string digest = random_digest();
  const Entry stored = make_entry("rownorm:kind=softmax,n=64,dtype=f32,pass=fwd");
  cache.store(digest, stored);
  CHECK(cache.writable());

  const std::optional<Entry> got = cache.load(digest, expected_for(stored));
  REQUIRE(got);
  CHECK(got->binary == stored.binary);
  const EntryMeta& m = got->meta;
  CHECK(m.digest == digest);
  CHECK(m.key_text == stored.meta.key_text);
  CHECK(m.arch == "sm_90a");
  CHECK(m.emit == "cubin");
  CHECK(m.nvrtc_version == "13.0");
  CHECK(m.library_version == "0.1.0");
  CHECK(m.options == stored.meta.options);
  CHECK(m.lowered_name == stored.meta.lowered_name);
  CHECK(m.compile_ms == stored.meta.compile_ms);
  CHECK(m.size == stored.binary.size());
  CHECK(m.checksum.size() == 32);
  CHECK(m.log == stored.meta.log);
  CHECK(m.created.size() == 20);  // 2025-01-31T12:34:56Z
  CHECK(m.created.back() == 'Z');

  // The documented layout, owner-only folders, and nothing that ties the cache to this folder.
  CHECK(fs::is_regular_file(binary_path(root, digest)));
  CHECK(fs::is_regular_file(record_path(root, digest)));
  for (const fs::path& made : {root, root / "v1", root / "v1" / "sm_90a", binary_path(root, digest).parent_path()})
    CHECK((fs::status(made).permissions() & fs::perms::all) == fs::perms::owner_all);
  CHECK(read_file(record_path(root, digest)).find(folder.path().string()) == std::string::npos);
}

TEST_CASE("a digest never stored is a miss and creates nothing", "[cache]") {
  TemporaryFolder folder;
  DiskCache cache(settings_for(folder.path() / "cache"));
  const Entry entry = make_entry("k");
  CHECK_FALSE(cache.load(random_digest(), expected_for(entry)));
  CHECK_FALSE(fs::exists(folder.path() / "cache"));
}

TEST_CASE("bad entries are refused, removed, and then a plain miss", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  const std::string digest = random_digest();
  const Entry stored = make_entry("k");
  cache.store(digest, stored);
  const fs::path binary = binary_path(root, digest), record = record_path(root, digest);

  SECTION("truncated binary") { write_file(binary, stored.binary.substr(0, 1000)); }
  SECTION("one bit flipped in the binary") {
    std::string flipped = stored.binary;
    flipped[std::size_t(rng()() % flipped.size())] ^= char(1 << (rng()() % 8));
    write_file(binary, flipped);
  }
  SECTION("zero-length binary") { write_file(binary, ""); }
  SECTION("record that is not JSON") { write_file(record, "{\"digest\": \"" + digest + "\", \"si"); }
  SECTION("record missing a field") {
    std::string text = read_file(record);
    text.replace(text.find("\"checksum\""), 10, "\"checksun\"");
    write_file(record, text);
  }
  SECTION("record of another digest") {
    std::string text = read_file(record);
    text.replace(text.find(digest), digest.size(), std::string(digest.size(), '0'));
    write_file(record, text);
  }
  SECTION("record missing for longer than a store takes") {
    fs::remove(record);
    age_file(binary, std::chrono::minutes(5));
  }

  const std::string warning = stderr_of([&] { CHECK_FALSE(cache.load(digest, expected_for(stored))); });
  CHECK(std::count(warning.begin(), warning.end(), '\n') == 1);
  CHECK_THAT(warning, Catch::Matchers::Contains(binary.string()) && Catch::Matchers::Contains("removed"));
  CHECK_FALSE(fs::exists(binary));
  CHECK_FALSE(fs::exists(record));
  CHECK(stderr_of([&] { CHECK_FALSE(cache.load(digest, expected_for(stored))); }).empty());  // plain miss
  CHECK(cache.writable());
}

TEST_CASE("half an entry is a plain miss while a store or removal may be under way", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  const std::string digest = random_digest();
  const Entry stored = make_entry("k");
  cache.store(digest, stored);

  SECTION("binary without its record yet") {
    fs::remove(record_path(root, digest));
    CHECK_FALSE(cache.load(digest, expected_for(stored)));
    CHECK(fs::exists(binary_path(root, digest)));  // left for the store to complete
  }
  SECTION("record whose binary is gone") {
    fs::remove(binary_path(root, digest));
    CHECK_FALSE(cache.load(digest, expected_for(stored)));
  }
  cache.store(digest, stored);  // a later store makes the entry whole again
  CHECK(same_entry(cache.load(digest, expected_for(stored)), stored));
}

TEST_CASE("entries of another library version, NVRTC version or emit kind are refused", "[cache]") {
  TemporaryFolder folder;
  DiskCache cache(settings_for(folder.path()));
  const std::string digest = random_digest();
  Entry stored = make_entry("k");
  EntryMeta expected = expected_for(stored);

  SECTION("library version") { stored.meta.library_version = "0.0.9"; }
  SECTION("NVRTC version") { stored.meta.nvrtc_version = "12.4"; }
  SECTION("emit kind") { stored.meta.emit = "ptx"; }
  cache.store(digest, stored);
  CHECK_FALSE(cache.load(digest, expected));
  CHECK_FALSE(fs::exists(binary_path(folder.path(), digest)));
  CHECK_FALSE(fs::exists(record_path(folder.path(), digest)));
}

TEST_CASE("empty expected fields accept any value", "[cache]") {
  TemporaryFolder folder;
  DiskCache cache(settings_for(folder.path()));
  const std::string digest = random_digest();
  const Entry stored = make_entry("k");
  cache.store(digest, stored);
  EntryMeta expected;
  expected.arch = "sm_90a";  // the arch locates the entry: it is always needed
  CHECK(same_entry(cache.load(digest, expected), stored));
}

TEST_CASE("malformed digests and arches are refused", "[cache]") {
  TemporaryFolder folder;
  DiskCache cache(settings_for(folder.path()));
  Entry entry = make_entry("k");
  using Catch::Matchers::Contains;
  CHECK_THROWS_AS(cache.load("0123456789abcde", expected_for(entry)), InvalidArgument);     // 15 digits
  CHECK_THROWS_AS(cache.load(std::string(65, 'a'), expected_for(entry)), InvalidArgument);  // 65 digits
  CHECK_THROWS_WITH(cache.store("0123456789ABCDEF", entry), Contains("0123456789ABCDEF"));
  CHECK_THROWS_AS(cache.store("../../../etc/passwd", entry), InvalidArgument);
  entry.meta.arch = "../sm_90";
  CHECK_THROWS_WITH(cache.store(random_digest(), entry), Contains("../sm_90"));
  entry.meta.arch = "";
  CHECK_THROWS_AS(cache.load(random_digest(), entry.meta), InvalidArgument);
  entry = make_entry("k", 0);
  CHECK_THROWS_AS(cache.store(random_digest(), entry), InvalidArgument);
  CHECK(file_names_under(folder.path()).empty());
}

TEST_CASE("SJIT_CACHE=ro uses entries and writes nothing, and off uses nothing", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  const std::string digest = random_digest();
  const Entry stored = make_entry("k");
  DiskCache(settings_for(root)).store(digest, stored);

  SECTION("ro") {
    DiskCache cache(settings_for(root, Mode::ro));
    CHECK_FALSE(cache.writable());
    CHECK(same_entry(cache.load(digest, expected_for(stored)), stored));
    const std::string other = random_digest();
    cache.store(other, make_entry("other"));
    CHECK_FALSE(fs::exists(binary_path(root, other)));
    // A bad entry is refused but, the cache being read-only, stays where it is.
    write_file(binary_path(root, digest), stored.binary.substr(1));
    CHECK_FALSE(cache.load(digest, expected_for(stored)));
    CHECK(fs::exists(binary_path(root, digest)));
    CHECK_THROWS_AS(cache.clear(), Error);
    CHECK_THROWS_AS(cache.prune(0), Error);
    CHECK_THROWS_AS(cache.verify(true), Error);
    CHECK(cache.verify(false).problems.size() == 1);
  }
  SECTION("off") {
    DiskCache cache(settings_for(root, Mode::off));
    CHECK_FALSE(cache.writable());
    CHECK_FALSE(cache.load(digest, expected_for(stored)));
    const std::string other = random_digest();
    cache.store(other, make_entry("other"));
    CHECK_FALSE(fs::exists(binary_path(root, other)));
  }
}

TEST_CASE("8 processes storing and loading one digest all succeed and leave one entry", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "cache";  // the race starts with creating the folders
  const std::string digest = random_digest();
  const Entry stored = make_entry("raced", 64 * 1024);
  constexpr int kProcesses = 8, kRounds = 100;
  const std::vector<std::string> variants = compile_variants(stored.binary, kProcesses);

  const std::string warnings = stderr_of([&] {
    test::run_child_processes(kProcesses, [&](int p) {  // each exits 0 when all went well
      int status = 0;
      DiskCache cache(settings_for(root));
      Entry mine = stored;
      mine.binary = variants[p];
      mine.meta.compile_ms = p;
      for (int round = 0; round < kRounds && status == 0; ++round) {
        cache.store(digest, mine);
        if (!one_of(cache.load(digest, expected_for(stored)), variants, stored)) status = 1;
      }
      if (!cache.writable()) status = 2;
      return status;
    });
  });
  CHECK(warnings.empty());  // no store ever left a mismatched pair for a load to find
  const std::vector<std::string> files = file_names_under(root);
  CAPTURE(files);
  CHECK(files.size() == 2);
  CHECK(count_with_suffix(files, ".bin") == 1);
  CHECK(count_with_suffix(files, ".json") == 1);
  CHECK(one_of(DiskCache(settings_for(root)).load(digest, expected_for(stored)), variants, stored));
}

TEST_CASE("8 threads storing and loading one digest all succeed and leave one entry", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "cache";
  const std::string digest = random_digest();
  const Entry stored = make_entry("raced", 64 * 1024);
  constexpr int kThreads = 8;
  const std::vector<std::string> variants = compile_variants(stored.binary, kThreads);
  DiskCache cache(settings_for(root));
  std::atomic<int> failures{0};
  const std::string warnings = stderr_of([&] {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        Entry mine = stored;
        mine.binary = variants[t];
        for (int round = 0; round < 100; ++round) {
          cache.store(digest, mine);
          if (!one_of(cache.load(digest, expected_for(stored)), variants, stored)) ++failures;
        }
      });
    for (std::thread& t : threads) t.join();
  });
  CHECK(failures == 0);
  CHECK(warnings.empty());
  CHECK(cache.writable());
  const std::vector<std::string> files = file_names_under(root);
  CAPTURE(files);
  CHECK(files.size() == 2);
  CHECK(count_with_suffix(files, ".bin") == 1);
  CHECK(count_with_suffix(files, ".json") == 1);
}

TEST_CASE("a read-only cache folder turns writes off without throwing and still serves entries", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "cache";
  const std::string digest = random_digest();
  const Entry stored = make_entry("k");
  DiskCache(settings_for(root)).store(digest, stored);
  make_tree_read_only(root);

  Mode mode = Mode::rw;
  if (can_write_into(root)) {
    WARN("running as root, where chmod does not stop writes: testing SJIT_CACHE=ro instead");
    mode = Mode::ro;
  }
  DiskCache cache(settings_for(root, mode));
  const std::string other = random_digest();
  CHECK_NOTHROW(cache.store(other, make_entry("other")));
  CHECK_FALSE(cache.writable());
  CHECK_FALSE(fs::exists(binary_path(root, other)));
  CHECK(same_entry(cache.load(digest, expected_for(stored)), stored));
  CHECK_NOTHROW(cache.store(random_digest(), make_entry("third")));
  CHECK(file_names_under(root).size() == 2);
}

TEST_CASE("a cache folder that becomes unwritable mid-run turns writes off without throwing", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "cache";
  DiskCache cache(settings_for(root));
  const std::string first = random_digest();
  const Entry stored = make_entry("first");
  cache.store(first, stored);
  REQUIRE(cache.writable());

  SECTION("the arch folder is replaced by a file") {
    fs::rename(root / "v1" / "sm_90a", folder.path() / "moved-away");
    write_file(root / "v1" / "sm_90a", "not a folder");
  }
  SECTION("the entry folders lose their write permission") {
    make_tree_read_only(root);
    if (can_write_into(root)) {
      WARN("running as root, where chmod does not stop writes: replacing the arch folder by a file instead");
      for (const fs::path& f : {root, root / "v1", root / "v1" / "sm_90a"}) fs::permissions(f, fs::perms::owner_all);
      fs::rename(root / "v1" / "sm_90a", folder.path() / "moved-away");
      write_file(root / "v1" / "sm_90a", "not a folder");
    }
  }
  const std::string second = random_digest();
  CHECK_NOTHROW(cache.store(second, make_entry("second")));
  CHECK_FALSE(cache.writable());
  CHECK_NOTHROW(cache.store(random_digest(), make_entry("third")));  // quietly does nothing
  CHECK_FALSE(cache.load(second, expected_for(stored)));
}

TEST_CASE("a store that fails after writing its temporary file removes it", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  const std::string digest = random_digest();
  fs::create_directories(binary_path(root, digest));  // a folder in the way: the rename into place fails
  std::string warning = stderr_of([&] { CHECK_NOTHROW(cache.store(digest, make_entry("k"))); });
  CHECK_THAT(warning, Catch::Matchers::Contains("writes are off") && Catch::Matchers::Contains("rename"));
  CHECK_FALSE(cache.writable());
  CHECK(file_names_under(root).empty());
  warning = stderr_of([&] { cache.store(random_digest(), make_entry("k")); });
  CHECK(warning.empty());  // said once
}

TEST_CASE("eviction under the size cap keeps the most recently used entries", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache roomy(settings_for(root));
  std::vector<std::string> digests;
  std::vector<Entry> entries;
  for (int i = 0; i < 4; ++i) {
    digests.push_back(random_digest());
    entries.push_back(make_entry("key-" + std::to_string(i)));
    roomy.store(digests[i], entries[i]);
    let_the_clock_tick();
  }
  REQUIRE(roomy.load(digests[0], expected_for(entries[0])));  // the oldest store is now the latest use
  let_the_clock_tick();
  const Stats before = roomy.stats();
  REQUIRE(before.entries == 4);
  const std::uint64_t entry_bytes = before.bytes / 4;

  DiskCache small(settings_for(root, Mode::rw, entry_bytes * 7 / 2));  // room for three and a half
  digests.push_back(random_digest());
  entries.push_back(make_entry("key-4"));
  small.store(digests[4], entries[4]);
  CHECK(small.stats().entries == 3);
  CHECK(small.stats().bytes <= entry_bytes * 7 / 2);
  for (int kept : {0, 3, 4}) CHECK(fs::exists(binary_path(root, digests[kept])));
  for (int evicted : {1, 2}) {
    CHECK_FALSE(fs::exists(binary_path(root, digests[evicted])));
    CHECK_FALSE(fs::exists(record_path(root, digests[evicted])));
  }
}

TEST_CASE("prune removes the least recently used entries down to a size", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  std::vector<std::string> digests;
  for (int i = 0; i < 5; ++i) {
    digests.push_back(random_digest());
    cache.store(digests[i], make_entry("key-" + std::to_string(i)));
    let_the_clock_tick();
  }
  const std::uint64_t entry_bytes = cache.stats().bytes / 5;
  CHECK(cache.prune(cache.stats().bytes) == 0);
  CHECK(cache.prune(entry_bytes * 5 / 2) == 3);
  for (int i = 0; i < 5; ++i) CHECK(fs::exists(binary_path(root, digests[i])) == (i >= 3));
  CHECK(cache.prune(0) == 2);
  CHECK(cache.stats().entries == 0);
  CHECK(cache.stats().bytes == 0);
}

TEST_CASE("verify reports every bad entry and stray file, and removes them only with fix", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  std::map<std::string, std::string> digest_of;  // role -> digest
  for (const char* role : {"good", "good too", "flipped", "truncated record", "old lone binary",
                           "old lone record", "fresh lone binary"}) {
    digest_of[role] = random_digest();
    cache.store(digest_of[role], make_entry(role));
  }
  std::string flipped = read_file(binary_path(root, digest_of["flipped"]));
  flipped[100] ^= 0x10;
  write_file(binary_path(root, digest_of["flipped"]), flipped);
  const std::string record = read_file(record_path(root, digest_of["truncated record"]));
  write_file(record_path(root, digest_of["truncated record"]), record.substr(0, record.size() / 2));
  fs::remove(record_path(root, digest_of["old lone binary"]));
  age_file(binary_path(root, digest_of["old lone binary"]), std::chrono::minutes(3));
  fs::remove(binary_path(root, digest_of["old lone record"]));
  age_file(record_path(root, digest_of["old lone record"]), std::chrono::minutes(3));
  fs::remove(record_path(root, digest_of["fresh lone binary"]));
  const fs::path prefix_folder = binary_path(root, digest_of["good"]).parent_path();
  const fs::path old_temporary = prefix_folder / ".0123456789abcdef.bin.99.1f.00000000000000aa.tmp";
  const fs::path fresh_temporary = prefix_folder / ".0123456789abcdef.json.98.2f.00000000000000bb.tmp";
  write_file(old_temporary, "half");
  age_file(old_temporary, std::chrono::minutes(2));
  write_file(fresh_temporary, "being written");
  write_file(prefix_folder / "README", "a file of the user's: not the cache's business");

  const std::vector<std::string> bad = {"flipped", "truncated record", "old lone binary", "old lone record"};
  auto reported = [&](const VerifyReport& report, const std::string& what) {
    return std::count_if(report.problems.begin(), report.problems.end(),
                         [&](const std::string& line) { return line.find(what) != std::string::npos; });
  };

  const VerifyReport look = cache.verify(false);
  CAPTURE(look.problems);
  CHECK(look.checked == 7);
  CHECK(look.problems.size() == 5);
  for (const std::string& role : bad) CHECK(reported(look, digest_of[role]) == 1);
  CHECK(reported(look, old_temporary.filename().string()) == 1);
  CHECK(look.removed == 0);
  CHECK(fs::exists(binary_path(root, digest_of["flipped"])));
  CHECK(fs::exists(old_temporary));

  const VerifyReport fixed = cache.verify(true);
  CHECK(fixed.problems.size() == 5);
  CHECK(fixed.removed == 5);
  for (const std::string& role : bad) {
    CHECK_FALSE(fs::exists(binary_path(root, digest_of[role])));
    CHECK_FALSE(fs::exists(record_path(root, digest_of[role])));
  }
  CHECK_FALSE(fs::exists(old_temporary));
  CHECK(fs::exists(fresh_temporary));
  CHECK(fs::exists(binary_path(root, digest_of["fresh lone binary"])));
  CHECK(fs::exists(prefix_folder / "README"));

  const VerifyReport after = cache.verify(false);
  CHECK(after.problems.empty());
  CHECK(after.checked == 3);
}

TEST_CASE("list shows complete entries, most recently used first", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  const std::string older = random_digest(), newer = random_digest();
  cache.store(older, make_entry("older"));
  let_the_clock_tick();
  cache.store(newer, make_entry("newer", 1000));
  const std::vector<EntryInfo> infos = cache.list();
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].meta.key_text == "newer");
  CHECK(infos[0].binary_path == binary_path(root, newer));
  CHECK(infos[0].bytes_on_disk == 1000 + fs::file_size(record_path(root, newer)));
  CHECK(infos[1].meta.key_text == "older");
  CHECK(infos[0].last_used > infos[1].last_used);
  const Stats stats = cache.stats();
  CHECK(stats.entries == 2);
  CHECK(stats.bytes == infos[0].bytes_on_disk + infos[1].bytes_on_disk);
  CHECK(stats.root == root);
  CHECK(stats.mode == Mode::rw);
}

TEST_CASE("clear removes every entry and leaves the user's own files", "[cache]") {
  TemporaryFolder folder;
  const fs::path root = folder.path();
  DiskCache cache(settings_for(root));
  for (int i = 0; i < 3; ++i) cache.store(random_digest(), make_entry("key-" + std::to_string(i)));
  Entry elsewhere = make_entry("another arch");
  elsewhere.meta.arch = "sm_80";
  cache.store(random_digest(), elsewhere);
  write_file(root / "notes.txt", "mine");
  cache.clear();
  CHECK(cache.stats().entries == 0);
  CHECK(cache.list().empty());
  CHECK(fs::exists(root / "notes.txt"));
  CHECK(file_names_under(root) == std::vector<std::string>{"notes.txt"});
  const std::string digest = random_digest();
  const Entry again = make_entry("after clear");
  cache.store(digest, again);
  CHECK(same_entry(cache.load(digest, expected_for(again)), again));
}

TEST_CASE("settings come from the environment", "[cache]") {
  const auto guard = cache_environment();
  guard.clear_all();
  ::setenv("HOME", "/home/someone", 1);
  Settings s = settings_from_environment();
  CHECK(s.root == fs::path("/home/someone/.cache/sparsejit"));
  CHECK(s.mode == Mode::rw);
  CHECK(s.max_bytes == 2ull << 30);

  ::setenv("XDG_CACHE_HOME", "/xdg/cache", 1);
  CHECK(settings_from_environment().root == fs::path("/xdg/cache/sparsejit"));
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);  // the XDG spec says to ignore it
  CHECK(settings_from_environment().root == fs::path("/home/someone/.cache/sparsejit"));
  ::setenv("SJIT_CACHE_DIR", "/srv/kernels", 1);
  CHECK(settings_from_environment().root == fs::path("/srv/kernels"));
  ::setenv("SJIT_CACHE_DIR", "kernels", 1);
  CHECK(settings_from_environment().root == fs::current_path() / "kernels");

  const std::pair<const char*, Mode> modes[] = {{"rw", Mode::rw}, {"ro", Mode::ro}, {"off", Mode::off}, {"", Mode::rw}};
  for (const auto& [text, mode] : modes) {
    ::setenv("SJIT_CACHE", text, 1);
    CHECK(settings_from_environment().mode == mode);
  }
  CHECK(to_string(Mode::ro) == "ro");

  const std::pair<const char*, std::uint64_t> sizes[] = {
      {"12345", 12345}, {"64K", 64ull << 10}, {"3M", 3ull << 20}, {"2g", 2ull << 30}, {"", 2ull << 30}};
  for (const auto& [text, bytes] : sizes) {
    ::setenv("SJIT_CACHE_MAX_SIZE", text, 1);
    CHECK(settings_from_environment().max_bytes == bytes);
  }
}

TEST_CASE("bad cache settings in the environment are refused, naming the variable and value", "[cache]") {
  using Catch::Matchers::Contains;
  const auto guard = cache_environment();
  guard.clear_all();
  ::setenv("HOME", "/home/someone", 1);

  ::setenv("SJIT_CACHE", "readonly", 1);
  CHECK_THROWS_AS(settings_from_environment(), InvalidArgument);
  CHECK_THROWS_WITH(settings_from_environment(), Contains("SJIT_CACHE='readonly'") && Contains("rw") &&
                                                     Contains("ro") && Contains("off"));
  ::unsetenv("SJIT_CACHE");

  for (const char* bad : {"10X", "-5", "0", "1.5G", "K", "12 M", "64KB", "99999999999G"}) {
    CAPTURE(bad);
    ::setenv("SJIT_CACHE_MAX_SIZE", bad, 1);
    CHECK_THROWS_AS(settings_from_environment(), InvalidArgument);
    CHECK_THROWS_WITH(settings_from_environment(), Contains(fmt::format("SJIT_CACHE_MAX_SIZE='{}'", bad)) &&
                                                       Contains("K, M or G"));
  }
  ::unsetenv("SJIT_CACHE_MAX_SIZE");

  ::unsetenv("HOME");
  CHECK_THROWS_WITH(settings_from_environment(), Contains("SJIT_CACHE_DIR"));
  ::setenv("SJIT_CACHE", "off", 1);
  CHECK_NOTHROW(settings_from_environment());
}
