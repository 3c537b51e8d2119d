// The tuning database on disk: keys and buckets, round trips, races between processes and threads,
// corrupt and foreign files, read-only folders, export and import, and the SJIT_AUTOTUNE policy.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "sparsejit/error.h"
#include "support/temp_dir.h"
#include "support/test_support.h"
#include "tune/tuning_db.h"

using namespace sjit;
using namespace sjit::tune;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using test::can_write_into;
using test::CapturedStderr;
using test::files_under;
using test::make_tree_read_only;
using test::read_file;
using test::write_file;

// A fresh folder for one test, removed at the end.
struct TemporaryFolder : test::TempDir {
  TemporaryFolder() : TempDir("sjit-tune-test-") {}
};

int count_lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

DeviceModel h100() { return {"NVIDIA H100 80GB HBM3", 9, 0, 132}; }

TuningKey make_key(const std::string& spec_key = "rownorm:kind=softmax,n=128,dtype=f16",
                   const std::string& bucket = "rows<=65536") {
  return {h100(), "rownorm", spec_key, bucket};
}

TuningEntry make_entry(const TuningKey& key, const std::string& winner = "tpr=4,vec=4,block=256,smem=0",
                       double winner_us = 12.345678901234567) {
  TuningEntry entry;
  entry.key = key;
  entry.winner_config = winner;
  entry.winner_us = winner_us;
  entry.default_config = "tpr=1,vec=4,block=128,smem=0";
  entry.default_us = 20.5;
  entry.candidates = 37;
  entry.measured_at = "2025-01-02T03:04:05Z";
  entry.library_version = "0.1.0";
  entry.kernels = "0123456789abcdef";
  return entry;
}

void check_same_entry(const std::optional<TuningEntry>& got, const TuningEntry& want) {
  REQUIRE(got.has_value());
  CHECK(got->key == want.key);
  CHECK(got->winner_config == want.winner_config);
  CHECK(got->winner_us == want.winner_us);
  CHECK(got->default_config == want.default_config);
  CHECK(got->default_us == want.default_us);
  CHECK(got->candidates == want.candidates);
  CHECK(got->measured_at == want.measured_at);
  CHECK(got->library_version == want.library_version);
  CHECK(got->kernels == want.kernels);
}

int count_temporary_files(const std::vector<fs::path>& files) {
  return static_cast<int>(test::count_stray_files(files, {".json"}));
}

// The one entry file under `root` (the test stored exactly one).
fs::path only_file(const fs::path& root) {
  const std::vector<fs::path> files = files_under(root);
  REQUIRE(files.size() == 1);
  return files.front();
}

// The variables this suite changes, put back at the end of a test.
sjit::test::EnvironmentGuard tuning_environment() {
  return sjit::test::EnvironmentGuard({"SJIT_AUTOTUNE", "SJIT_TUNE_DIR", "XDG_DATA_HOME", "HOME"});
}

// The document export_json writes, holding `entries` as given (a JSON array's text).
std::string import_document(const std::string& entries, const std::string& format = "\"sparsejit-tuning\"",
                            const std::string& version = "1") {
  return "{\"format\": " + format + ", \"version\": " + version + ", \"entries\": " + entries + "}";
}

std::string entry_text(const TuningEntry& entry) {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  REQUIRE(db.store(entry));
  return read_file(only_file(folder.path()));
}

}  // namespace

TEST_CASE("a key leads to one file named by its device and digest", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningEntry entry = make_entry(make_key());
  REQUIRE(db.store(entry));
  REQUIRE(db.store(entry));
  const fs::path file = only_file(folder.path());
  CHECK(file.parent_path() == folder.path() / "v1" / "nvidia-h100-80gb-hbm3_sm90_132sm");
  const std::string stem = file.stem().string();
  CHECK(stem.size() == 32);
  CHECK(stem.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(file.extension() == ".json");

  // The file holds the whole key, for a reader to check against the key it asked for.
  const nlohmann::json inside = nlohmann::json::parse(read_file(file));
  CHECK(inside.at("key").at("device").at("name") == "NVIDIA H100 80GB HBM3");
  CHECK(inside.at("key").at("device").at("cc_major") == 9);
  CHECK(inside.at("key").at("device").at("cc_minor") == 0);
  CHECK(inside.at("key").at("device").at("multiprocessors") == 132);
  CHECK(inside.at("key").at("op") == "rownorm");
  CHECK(inside.at("key").at("spec_key") == entry.key.spec_key);
  CHECK(inside.at("key").at("bucket") == "rows<=65536");
}

TEST_CASE("every field of the key makes a different entry", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningKey base = make_key();
  std::vector<TuningKey> keys(10, base);
  keys[1].device.name = "NVIDIA H200";
  keys[2].device.cc_major = 10;
  keys[3].device.cc_minor = 1;
  keys[4].device.multiprocessors = 114;
  keys[5].op = "rownorm2";
  keys[6].spec_key += ",alpha=1.5";
  keys[7].bucket = "rows<=1024";
  // Fields that concatenate to the same text must still differ.
  keys[8].op = "rownorm:";
  keys[8].spec_key = "x";
  keys[9].op = "rownorm";
  keys[9].spec_key = ":x";
  for (std::size_t i = 0; i < keys.size(); ++i) REQUIRE(db.store(make_entry(keys[i], "winner-" + std::to_string(i))));

  CHECK(files_under(folder.path()).size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    CAPTURE(i);
    check_same_entry(db.find(keys[i]), make_entry(keys[i], "winner-" + std::to_string(i)));
  }
  CHECK(db.list().size() == keys.size());
}

TEST_CASE("rows are bucketed by the next power of two", "[tune]") {
  CHECK(shape_bucket(1) == "rows<=1");
  CHECK(shape_bucket(2) == "rows<=2");
  CHECK(shape_bucket(3) == "rows<=4");
  CHECK(shape_bucket(4) == "rows<=4");
  CHECK(shape_bucket(5) == "rows<=8");
  CHECK(shape_bucket(1000) == "rows<=1024");
  CHECK(shape_bucket(65536) == "rows<=65536");
  CHECK(shape_bucket(65537) == "rows<=131072");
  CHECK(shape_bucket(std::numeric_limits<std::int64_t>::max()) == "rows<=9223372036854775808");
  CHECK_THROWS_AS(shape_bucket(0), InvalidArgument);
  CHECK_THROWS_WITH(shape_bucket(-1), Contains("rows = -1"));
}

TEST_CASE("a stored entry is found again with every field, in private folders", "[tune]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "not-yet" / "tuning";  // store creates it
  TuningDb db(root);
  CHECK(db.root() == root);
  CHECK_FALSE(db.find(make_key()).has_value());  // no folder yet: a quiet miss
  CHECK(db.list().empty());

  TuningEntry entry = make_entry(make_key("rownorm:kind=entmax,alpha=1.5 \"quoted\" \\ ünïcode"));
  entry.key.device.name = "Ünusual GPU / model \t 2";
  entry.winner_us = 0.1;
  entry.default_us = 1e-300;
  entry.candidates = 0;
  REQUIRE(db.store(entry));
  check_same_entry(db.find(entry.key), entry);
  check_same_entry(TuningDb(root).find(entry.key), entry);  // another database object, as another process

  for (const fs::path& made : {folder.path() / "not-yet", root, root / "v1", only_file(root).parent_path()}) {
    CAPTURE(made);
    CHECK((fs::status(made).permissions() & fs::perms::all) == fs::perms::owner_all);
  }
  CHECK(only_file(root).parent_path().filename().string().find_first_of(" /\t") == std::string::npos);
}

// Entries written before the kernels were recorded have no "kernels" field: they still read, with an
// empty one, which no build's kernels match (so lookups pass over them: test_attention_tune.cpp).
TEST_CASE("an entry without the kernels it was measured with reads, with none", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningEntry entry = make_entry(make_key());
  REQUIRE(db.store(entry));
  const fs::path file = only_file(folder.path());
  nlohmann::json object = nlohmann::json::parse(read_file(file));
  REQUIRE(object.erase("kernels") == 1);
  { std::ofstream(file, std::ios::trunc) << object.dump(2); }
  const std::optional<TuningEntry> got = TuningDb(folder.path()).find(entry.key);
  REQUIRE(got.has_value());
  CHECK(got->kernels.empty());
  CHECK(got->winner_config == entry.winner_config);
}

TEST_CASE("a store replaces the entry of the same key", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningKey key = make_key();
  REQUIRE(db.store(make_entry(key, "first", 10)));
  const TuningEntry second = make_entry(key, "second", 5);
  REQUIRE(db.store(second));
  check_same_entry(db.find(key), second);
  CHECK(files_under(folder.path()).size() == 1);
  REQUIRE(db.list().size() == 1);
  CHECK(db.list().front().winner_config == "second");
}

TEST_CASE("a time that JSON cannot hold is refused before anything is written", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  CHECK_THROWS_AS(db.store(make_entry(make_key(), "w", std::numeric_limits<double>::quiet_NaN())), InvalidArgument);
  CHECK_THROWS_WITH(db.store(make_entry(make_key(), "w", std::numeric_limits<double>::infinity())),
                    Contains("field 'winner_us' = inf must be a finite number"));
  CHECK_THROWS_AS(db.store(make_entry(make_key("\xff not UTF-8"))), InvalidArgument);
  CHECK(files_under(folder.path()).empty());
}

TEST_CASE("8 processes storing one shared key and keys of their own all succeed", "[tune]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "tuning";  // the race starts with creating the folders
  constexpr int kProcesses = 8, kRounds = 40;
  const TuningKey shared = make_key();

  test::run_child_processes(kProcesses, [&](int p) {  // each exits 0 when all went well
    int status = 0;
    TuningDb db(root);
    const TuningKey own = make_key("rownorm:own=" + std::to_string(p));
    for (int round = 0; round < kRounds && status == 0; ++round) {
      if (!db.store(make_entry(shared, "process-" + std::to_string(p), p))) status = 1;
      if (!db.store(make_entry(own, "own", round))) status = 1;
      const auto found = db.find(shared);
      if (!found || found->winner_config != "process-" + std::to_string(static_cast<int>(found->winner_us)))
        status = 2;
      const auto mine = db.find(own);
      if (!mine || mine->winner_us != round) status = 2;
    }
    return status;
  });
  const std::vector<fs::path> files = files_under(root);
  CAPTURE(files);
  CHECK(files.size() == kProcesses + 1);
  CHECK(count_temporary_files(files) == 0);
  for (const fs::path& file : files) CHECK_NOTHROW(nlohmann::json::parse(read_file(file)).at("key"));
  CHECK(TuningDb(root).list().size() == kProcesses + 1);
}

TEST_CASE("8 threads storing one shared key and keys of their own all succeed", "[tune]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "tuning";
  constexpr int kThreads = 8, kRounds = 40;
  const TuningKey shared = make_key();
  TuningDb db(root);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const TuningKey own = make_key("rownorm:own=" + std::to_string(t));
      for (int round = 0; round < kRounds; ++round) {
        if (!db.store(make_entry(shared, "thread-" + std::to_string(t), t))) ++failures;
        if (!db.store(make_entry(own, "own", round))) ++failures;
        const auto found = db.find(shared);
        if (!found || found->winner_config != "thread-" + std::to_string(static_cast<int>(found->winner_us)))
          ++failures;
        const auto mine = db.find(own);
        if (!mine || mine->winner_us != round) ++failures;
      }
    });
  for (std::thread& thread : threads) thread.join();
  CHECK(failures == 0);
  const std::vector<fs::path> files = files_under(root);
  CAPTURE(files);
  CHECK(files.size() == kThreads + 1);
  CHECK(count_temporary_files(files) == 0);
  for (const fs::path& file : files) CHECK_NOTHROW(nlohmann::json::parse(read_file(file)).at("key"));
  CHECK(db.list().size() == kThreads + 1);
}

TEST_CASE("a corrupt or foreign entry file is a miss, reported once and removed", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningEntry entry = make_entry(make_key());
  REQUIRE(db.store(entry));
  const fs::path file = only_file(folder.path());
  const std::string good = read_file(file);
  const std::string other = entry_text(make_entry(make_key("rownorm:other")));

  nlohmann::json missing_field = nlohmann::json::parse(good);
  missing_field.erase("candidates");
  nlohmann::json wrong_type = nlohmann::json::parse(good);
  wrong_type["key"]["device"]["multiprocessors"] = "132";
  std::string huge_time = good;  // JSON has no infinity; nlohmann refuses a number this large
  huge_time.replace(huge_time.find("12.345678901234567"), 18, "1e400");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated", good.substr(0, good.size() / 2)},
      {"garbage", "\x7f\x45\x4c\x46 not json at all \xff\xfe"},
      {"empty", ""},
      {"another key inside", other},
      {"a field missing", missing_field.dump()},
      {"a field of the wrong type", wrong_type.dump()},
      {"a number out of range", huge_time},
  };
  for (const auto& [name, bytes] : cases) {
    SECTION(name) {
      write_file(file, bytes);
      CapturedStderr captured;
      std::optional<TuningEntry> found;
      REQUIRE_NOTHROW(found = db.find(entry.key));
      CHECK_FALSE(found.has_value());
      const std::string warning = captured.text();
      CAPTURE(warning);
      CHECK(count_lines(warning) == 1);
      CHECK_THAT(warning, Contains(file.string()));
      CHECK_FALSE(fs::exists(file));

      // Once per path per process: the same trouble again is a quiet miss.
      write_file(file, bytes);
      CHECK_FALSE(db.find(entry.key).has_value());
      CHECK(captured.text() == warning);

      // A good store puts the entry back.
      REQUIRE(db.store(entry));
      check_same_entry(db.find(entry.key), entry);
    }
  }
}

TEST_CASE("list skips and removes bad files, and files whose key belongs elsewhere", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const TuningEntry entry = make_entry(make_key());
  REQUIRE(db.store(entry));
  const fs::path folder_of_entries = only_file(folder.path()).parent_path();
  const fs::path garbage = folder_of_entries / "0123456789abcdef0123456789abcdef.json";
  const fs::path copied = folder_of_entries / "fedcba9876543210fedcba9876543210.json";
  write_file(garbage, "{\"key\":");
  write_file(copied, entry_text(make_entry(make_key("rownorm:copied"))));

  CapturedStderr captured;
  const std::vector<TuningEntry> listed = db.list();
  REQUIRE(listed.size() == 1);
  check_same_entry(listed.front(), entry);
  const std::string warnings = captured.text();
  CAPTURE(warnings);
  CHECK(count_lines(warnings) == 2);
  CHECK_THAT(warnings, Contains(garbage.string()) && Contains(copied.string()));
  CHECK_FALSE(fs::exists(garbage));
  CHECK_FALSE(fs::exists(copied));
}

TEST_CASE("a read-only folder is still readable, and stores into it fail without throwing", "[tune]") {
  TemporaryFolder folder;
  const fs::path root = folder.path() / "tuning";
  const TuningEntry kept = make_entry(make_key("rownorm:kept"));
  const TuningEntry corrupt = make_entry(make_key("rownorm:corrupt"));
  REQUIRE(TuningDb(root).store(kept));
  REQUIRE(TuningDb(root).store(corrupt));
  fs::path corrupt_file;
  for (const fs::path& file : files_under(root))
    if (read_file(file).find("rownorm:corrupt") != std::string::npos) corrupt_file = file;
  write_file(corrupt_file, "{ torn");
  make_tree_read_only(root);

  const bool root_ignores_modes = can_write_into(corrupt_file.parent_path());
  fs::path unwritable = root;
  if (root_ignores_modes) {
    WARN("running as root, where chmod does not stop writes: storing under a regular file instead");
    write_file(folder.path() / "a-file", "");
    unwritable = folder.path() / "a-file" / "tuning";
  }

  CapturedStderr captured;
  TuningDb db(root);
  check_same_entry(db.find(kept.key), kept);
  CHECK_FALSE(db.find(corrupt.key).has_value());  // reported, treated as a miss
  if (!root_ignores_modes) CHECK(fs::exists(corrupt_file));  // could not be removed: left in place

  TuningDb blocked(unwritable);
  bool stored = true;
  REQUIRE_NOTHROW(stored = blocked.store(make_entry(make_key("rownorm:new"))));
  CHECK_FALSE(stored);
  REQUIRE_NOTHROW(stored = blocked.store(make_entry(make_key("rownorm:newer"))));
  CHECK_FALSE(stored);
  const std::string warnings = captured.text();
  CAPTURE(warnings);
  CHECK(count_lines(warnings) == 2);  // the corrupt file, then the folder (once for both stores)
  CHECK_THAT(warnings, Contains(corrupt_file.string()));
  CHECK_THAT(warnings, Contains(unwritable.string()));
  CHECK_THAT(warnings, Contains(root_ignores_modes ? "Not a directory" : "Permission denied"));

  check_same_entry(db.find(kept.key), kept);
  check_same_entry(db.list().at(0), kept);
  CHECK(count_temporary_files(files_under(root)) == 0);
}

TEST_CASE("export then import into an empty folder reproduces the database", "[tune]") {
  TemporaryFolder from_folder, to_folder;
  TuningDb from(from_folder.path());
  std::vector<TuningEntry> stored;
  for (const char* bucket : {"rows<=1024", "rows<=64", "rows<=65536"}) stored.push_back(make_entry(make_key("a", bucket)));
  TuningEntry h200 = make_entry(make_key("b"));
  h200.key.device = {"NVIDIA H200", 9, 0, 132};
  stored.push_back(h200);
  stored.push_back(make_entry(make_key("c")));
  for (const TuningEntry& entry : stored) REQUIRE(from.store(entry));

  const std::vector<TuningEntry> listed = from.list();
  REQUIRE(listed.size() == stored.size());
  // Sorted by device, op, spec, then bucket in the order of its numbers.
  CHECK(listed[0].key.spec_key == "a");
  CHECK(listed[0].key.bucket == "rows<=64");
  CHECK(listed[1].key.bucket == "rows<=1024");
  CHECK(listed[2].key.bucket == "rows<=65536");
  CHECK(listed[3].key.spec_key == "c");
  CHECK(listed[4].key.device.name == "NVIDIA H200");

  const std::string document = from.export_json();
  const nlohmann::json parsed = nlohmann::json::parse(document);
  CHECK(parsed.at("format") == "sparsejit-tuning");
  CHECK(parsed.at("version") == 1);
  CHECK(parsed.at("entries").size() == stored.size());

  TuningDb to(to_folder.path());
  CHECK(to.import_json(document) == static_cast<int>(stored.size()));
  const std::vector<TuningEntry> imported = to.list();
  REQUIRE(imported.size() == listed.size());
  for (std::size_t i = 0; i < listed.size(); ++i) {
    CAPTURE(i);
    check_same_entry(imported[i], listed[i]);
  }
  CHECK(to.export_json() == document);

  // Importing again replaces the same keys.
  CHECK(to.import_json(document) == static_cast<int>(stored.size()));
  CHECK(files_under(to_folder.path()).size() == stored.size());

  // A database with no folder yet exports a document with no entries, which imports as nothing.
  const std::string empty = TuningDb(to_folder.path() / "absent").export_json();
  CHECK(nlohmann::json::parse(empty).at("entries").empty());
  CHECK(to.import_json(empty) == 0);
}

TEST_CASE("a malformed import document is refused with its problem named, and nothing is stored", "[tune]") {
  TemporaryFolder folder;
  TuningDb db(folder.path());
  const nlohmann::json good = nlohmann::json::parse(entry_text(make_entry(make_key())));
  auto without = [&](const std::string& field) {
    nlohmann::json entry = good;
    entry.erase(field);
    return entry;
  };
  nlohmann::json bad_device = good;
  bad_device["key"]["device"].erase("cc_minor");
  nlohmann::json wrong_type = good;
  wrong_type["winner_us"] = "fast";
  nlohmann::json not_int = good;
  not_int["candidates"] = 2.5;
  nlohmann::json too_big = good;
  too_big["key"]["device"]["multiprocessors"] = 1LL << 40;
  auto entries = [&](std::initializer_list<nlohmann::json> list) { return nlohmann::json(list).dump(); };
  std::string huge_time = good.dump();  // JSON has no infinity, but an exponent this large reads as one
  huge_time.replace(huge_time.find("12.345678901234567"), 18, "1e400");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {import_document("[]", "\"sparsejit-kernels\""), "format"},
      {"{\"version\": 1, \"entries\": []}", "format"},
      {import_document("[]", "\"sparsejit-tuning\"", "2"), "version"},
      {import_document("[]", "\"sparsejit-tuning\"", "\"1\""), "version"},
      {import_document("{}"), "entries"},
      {import_document(entries({good, without("winner_config")})), "entry 1: field 'winner_config' is missing"},
      {import_document(entries({good, good, bad_device})), "entry 2: field 'key.device.cc_minor' is missing"},
      {import_document(entries({wrong_type, good})), "entry 0: field 'winner_us' must be a number, not string"},
      {import_document(entries({good, not_int})), "entry 1: field 'candidates' must be an integer"},
      {import_document(entries({good, too_big})), "entry 1: field 'key.device.multiprocessors'"},
      {import_document(entries({good, without("key")})), "entry 1: field 'key' is missing"},
      {import_document("[1]"), "entry 0: the entry must be an object"},
      {import_document("[" + huge_time + "]"), "not valid JSON"},
  };
  for (const auto& [document, problem] : cases) {
    CAPTURE(document);
    CHECK_THROWS_AS(db.import_json(document), InvalidArgument);
    CHECK_THROWS_WITH(db.import_json(document), Contains(problem));
    CHECK(files_under(folder.path()).empty());
  }
}

TEST_CASE("the autotune policy is off, on or force", "[tune]") {
  const auto guard = tuning_environment();
  CHECK(parse_policy("off") == Policy::off);
  CHECK(parse_policy("on") == Policy::on);
  CHECK(parse_policy("force") == Policy::force);
  for (Policy policy : {Policy::off, Policy::on, Policy::force}) CHECK(parse_policy(to_string(policy)) == policy);
  for (const char* bad : {"ON", "Force", "yes", "1", "", " on"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_policy(bad), InvalidArgument);
  }
  CHECK_THROWS_WITH(parse_policy("x"), "SJIT_AUTOTUNE = 'x' is not a policy: use off, on or force");

  ::unsetenv("SJIT_AUTOTUNE");
  CHECK(policy_from_environment() == Policy::off);
  ::setenv("SJIT_AUTOTUNE", "", 1);
  CHECK(policy_from_environment() == Policy::off);
  ::setenv("SJIT_AUTOTUNE", "force", 1);
  CHECK(policy_from_environment() == Policy::force);
  ::setenv("SJIT_AUTOTUNE", "on", 1);
  CHECK(policy_from_environment() == Policy::on);
  ::setenv("SJIT_AUTOTUNE", "sometimes", 1);
  CHECK_THROWS_WITH(policy_from_environment(), "SJIT_AUTOTUNE = 'sometimes' is not a policy: use off, on or force");
}

TEST_CASE("the default tuning folder follows SJIT_TUNE_DIR, XDG_DATA_HOME, then HOME", "[tune]") {
  const auto guard = tuning_environment();
  ::setenv("SJIT_TUNE_DIR", "/srv/tuning", 1);
  ::setenv("XDG_DATA_HOME", "/xdg", 1);
  ::setenv("HOME", "/home/someone", 1);
  CHECK(default_tuning_dir() == fs::path("/srv/tuning"));
  ::unsetenv("SJIT_TUNE_DIR");
  CHECK(default_tuning_dir() == fs::path("/xdg/sparsejit/tuning"));
  ::setenv("XDG_DATA_HOME", "", 1);
  CHECK(default_tuning_dir() == fs::path("/home/someone/.local/share/sparsejit/tuning"));
  ::setenv("XDG_DATA_HOME", "relative/ignored", 1);  // the XDG spec says to ignore a relative path
  CHECK(default_tuning_dir() == fs::path("/home/someone/.local/share/sparsejit/tuning"));
  ::unsetenv("XDG_DATA_HOME");
  ::unsetenv("HOME");
  CHECK_THROWS_AS(default_tuning_dir(), InvalidArgument);
}
