// Publishing a file so that readers see the old one or the new one whole, never part of one: the bytes go
// to a temporary file in the target's folder, which is then renamed over the target. Shared by the
// kernel cache (cache/disk_cache.cpp) and the tuning database (src/tune/tuning_db.cpp); each turns a
// FileError into its own report.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <stdexcept>
#include <string_view>

namespace sjit::cache {

// A failed file system call: the step, the path it failed on, the file being published and errno.
// what() is "cannot <operation()> <path()>: <strerror(error())>".
class FileError : public std::runtime_error {
 public:
  enum class Step {
    create_folder,  // path(): the folder
    create,         // path(): the temporary file
    write,          // path(): the temporary file (a failed write, fsync or close)
    rename,         // path(): the temporary file
  };

  FileError(Step step, std::filesystem::path path, std::filesystem::path target, int error);

  Step step() const { return step_; }
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& target() const { return target_; }  // empty with create_folder
  int error() const { return error_; }
  const char* operation() const;  // "create folder", "create", "write", "rename into place"

 private:
  Step step_;
  std::filesystem::path path_, target_;
  int error_;
};

// Creates the folder and any missing parents, owner-only (0700). Throws FileError (create_folder) if it
// cannot, or if something that is not a folder is in the way.
void make_private_folder(const std::filesystem::path& folder);

// A name for a temporary file next to `target` that no other writer, in this process or another, uses:
// ".<target's name>.<pid>.<thread>.<random>.tmp". pid and thread tell apart the writers alive at once;
// the random part, a name left by a dead process whose pid has come back. Hidden, so that `ls` shows
// finished files only.
std::filesystem::path temporary_name_for(const std::filesystem::path& target);

// True for a name temporary_name_for makes.
bool is_temporary_file_name(std::string_view file_name);

// A temporary file next to `target`, removed when this goes out of scope unless it was published.
// Every failure throws FileError.
class TemporaryFile {
 public:
  enum class MissingFolder {
    fail,      // the target's folder must exist
    recreate,  // made again (make_private_folder) if it vanished, e.g. removed by another process
  };

  // Creates the file (O_EXCL) with permissions `mode` (less the umask).
  TemporaryFile(const std::filesystem::path& target, mode_t mode, MissingFolder missing = MissingFolder::fail);
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile();

  void write(std::string_view bytes);  // all of them (retries interrupted and short writes)
  void sync();                         // fsync: the bytes are on disk before publish() renames
  void publish();                      // close (delayed write errors show here), then rename over the target

  const std::filesystem::path& path() const { return path_; }

 private:
  [[noreturn]] void fail(FileError::Step step) const;  // throws FileError with errno

  std::filesystem::path target_, path_;
  int fd_ = -1;
  bool published_ = false;
};

}  // namespace sjit::cache
