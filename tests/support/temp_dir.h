// Shared by the suites that work on folders (the kernel cache, the tuning database, warm-up): a fresh
// temporary folder, what is in it, read-only trees, captured stderr, and processes racing each other.
#pragma once

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace sjit::test {

// A fresh folder <system temporary folder>/<prefix><random number>, removed at the end with everything
// in it (permissions restored first, so read-only trees go too).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);
  const std::filesystem::path& path() const { return path_; }
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  std::filesystem::path path_;
};

// Regular files under `folder`, recursively; a folder that does not exist holds none.
std::vector<std::filesystem::path> files_under(const std::filesystem::path& folder);
std::vector<std::string> file_names_under(const std::filesystem::path& folder);  // their names alone

// Files that are not finished ones: hidden (as temporary files are: ".<name>....tmp") or without one of
// `finished_extensions` (".json"). What a store that failed half-way would leave behind.
std::size_t count_stray_files(const std::vector<std::filesystem::path>& files,
                              std::initializer_list<std::string_view> finished_extensions);

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);  // REQUIREs success

// chmod 0500 on `root` and every folder under it.
void make_tree_read_only(const std::filesystem::path& root);

// True when this process can create files in `folder` despite its permissions (root can): then chmod
// does not stop writes, and a test of an unwritable folder must make one another way.
bool can_write_into(const std::filesystem::path& folder);

// Forks `count` children, released together once all exist, each running child(index) and exiting with
// what it returns (4 if it throws; no Catch macros in there). Waits for them all and CHECKs that each
// exited with 0.
void run_child_processes(int count, const std::function<int(int index)>& child);

// Everything written to stderr (file descriptor 2) while this lives, for checking warnings.
class CapturedStderr {
 public:
  CapturedStderr();
  CapturedStderr(const CapturedStderr&) = delete;
  CapturedStderr& operator=(const CapturedStderr&) = delete;
  ~CapturedStderr();

  // What was written so far; stderr stays captured.
  std::string text() const;

 private:
  void restore();

  std::FILE* file_;
  int saved_ = -1;
};

// What `action` wrote to stderr.
template <class Action>
std::string stderr_of(Action action) {
  CapturedStderr captured;
  action();
  return captured.text();
}

}  // namespace sjit::test
