#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include "support/test_support.h"

namespace sjit::test {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  std::mt19937_64 random(fresh_seed());
  path_ = fs::temp_directory_path() / (prefix + std::to_string(random()));
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::permissions(path_, fs::perms::owner_all, ec);
  for (auto it = fs::recursive_directory_iterator(path_, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_directory(ec)) fs::permissions(it->path(), fs::perms::owner_all, ec);
  fs::remove_all(path_, ec);
}

std::vector<fs::path> files_under(const fs::path& folder) {
  std::vector<fs::path> files;
  if (!fs::exists(folder)) return files;
  for (const auto& item : fs::recursive_directory_iterator(folder))
    if (item.is_regular_file()) files.push_back(item.path());
  return files;
}

std::vector<std::string> file_names_under(const fs::path& folder) {
  std::vector<std::string> names;
  for (const fs::path& file : files_under(folder)) names.push_back(file.filename().string());
  return names;
}

std::size_t count_stray_files(const std::vector<fs::path>& files,
                              std::initializer_list<std::string_view> finished_extensions) {
  return static_cast<std::size_t>(std::count_if(files.begin(), files.end(), [&](const fs::path& file) {
    const bool finished = std::find(finished_extensions.begin(), finished_extensions.end(),
                                    file.extension().string()) != finished_extensions.end();
    return file.filename().string().front() == '.' || !finished;
  }));
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

void make_tree_read_only(const fs::path& root) {
  std::vector<fs::path> folders{root};
  for (const auto& item : fs::recursive_directory_iterator(root))
    if (item.is_directory()) folders.push_back(item.path());
  for (const fs::path& folder : folders) REQUIRE(::chmod(folder.c_str(), 0500) == 0);
}

bool can_write_into(const fs::path& folder) {
  const fs::path probe = folder / "write-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

void run_child_processes(int count, const std::function<int(int index)>& child) {
  int start[2];
  REQUIRE(::pipe(start) == 0);
  std::vector<pid_t> children;
  for (int index = 0; index < count; ++index) {
    const pid_t pid = ::fork();
    if (pid < 0) {  // let the children already made run and finish
      ::close(start[0]);
      ::close(start[1]);
    }
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the child: no Catch macros here, only an exit status
      ::close(start[1]);
      char go;
      if (::read(start[0], &go, 1) != 0) ::_exit(3);  // returns 0 once the parent closes the pipe
      int status = 4;
      try {
        status = child(index);
      } catch (...) {
      }
      ::_exit(status);
    }
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);  // go
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CAPTURE(pid, status);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

CapturedStderr::CapturedStderr() : file_(std::tmpfile()) {
  REQUIRE(file_ != nullptr);
  std::fflush(stderr);
  saved_ = ::dup(2);
  REQUIRE(saved_ >= 0);
  REQUIRE(::dup2(::fileno(file_), 2) == 2);
}

CapturedStderr::~CapturedStderr() {
  restore();
  std::fclose(file_);
}

std::string CapturedStderr::text() const {
  std::fflush(stderr);
  std::string out;
  char buffer[4096];
  for (ssize_t n, offset = 0; (n = ::pread(::fileno(file_), buffer, sizeof buffer, offset)) > 0; offset += n)
    out.append(buffer, static_cast<std::size_t>(n));
  return out;
}

void CapturedStderr::restore() {
  std::fflush(stderr);
  if (saved_ >= 0) ::dup2(saved_, 2);
  if (saved_ >= 0) ::close(saved_);
  saved_ = -1;
}

}  // namespace sjit::test
