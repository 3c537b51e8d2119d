// Publishing a file by rename: temporary names, private folders, the temporary file itself.
#include "cache/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>

namespace sjit::cache {

namespace fs = std::filesystem;

namespace {

const char* operation_of(FileError::Step step) {
  switch (step) {
    case FileError::Step::create_folder: return "create folder";
    case FileError::Step::create: return "create";
    case FileError::Step::write: return "write";
    case FileError::Step::rename: return "rename into place";
  }
  return "use";
}

}  // namespace

FileError::FileError(Step step, fs::path path, fs::path target, int error)
    : std::runtime_error(fmt::format("cannot {} {}: {}", operation_of(step), path.string(), std::strerror(error))),
      step_(step),
      path_(std::move(path)),
      target_(std::move(target)),
      error_(error) {}

const char* FileError::operation() const { return operation_of(step_); }

void make_private_folder(const fs::path& folder) {
  auto fail = [&](int error) { throw FileError(FileError::Step::create_folder, folder, {}, error); };
  if (::mkdir(folder.c_str(), 0700) != 0) {
    const int error = errno;
    const fs::path parent = folder.parent_path();
    if (error == ENOENT && !parent.empty() && parent != folder) {
      make_private_folder(parent);
      if (::mkdir(folder.c_str(), 0700) != 0 && errno != EEXIST) fail(errno);
    } else if (error != EEXIST) {
      fail(error);
    }
  }
  struct stat st {};
  if (::stat(folder.c_str(), &st) != 0) fail(errno);
  if (!S_ISDIR(st.st_mode)) fail(ENOTDIR);
}

fs::path temporary_name_for(const fs::path& target) {
  thread_local std::mt19937_64 random(std::random_device{}());
  const std::size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  return target.parent_path() /
         fmt::format(".{}.{}.{:x}.{:016x}.tmp", target.filename().string(), ::getpid(), thread, random());
}

bool is_temporary_file_name(std::string_view file_name) {
  return file_name.size() > 5 && file_name.front() == '.' && file_name.ends_with(".tmp");
}

TemporaryFile::TemporaryFile(const fs::path& target, mode_t mode, MissingFolder missing)
    : target_(target), path_(temporary_name_for(target)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd_ < 0 && errno == ENOENT && missing == MissingFolder::recreate) {
    make_private_folder(target.parent_path());
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  }
  if (fd_ < 0) fail(FileError::Step::create);
}

TemporaryFile::~TemporaryFile() {
  // Failure path: the caller reports the failure, and nothing more can be done if these fail.
  if (fd_ >= 0) ::close(fd_);
  if (!published_) ::unlink(path_.c_str());
}

void TemporaryFile::write(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(FileError::Step::write);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

void TemporaryFile::sync() {
  if (::fsync(fd_) != 0) fail(FileError::Step::write);
}

void TemporaryFile::publish() {
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail(FileError::Step::write);  // delayed write errors (NFS, quota) show here
  if (::rename(path_.c_str(), target_.c_str()) != 0) fail(FileError::Step::rename);
  published_ = true;
}

void TemporaryFile::fail(FileError::Step step) const {
  const int error = errno;  // before anything else can change it
  throw FileError(step, path_, target_, error);
}

}  // namespace sjit::cache
