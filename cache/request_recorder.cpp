#include "cache/request_recorder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

#include <fmt/format.h>

namespace sjit::cache {
namespace {

struct Recorder {
  std::mutex mutex;
  bool loaded = false, failed = false;
  std::set<std::string> seen;  // keys already in the file (read once) or written by this process
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: may be used during static teardown
  return *r;
}

}  // namespace

void record_request(const std::string& kernel_key) {
  const char* path = std::getenv("SJIT_RECORD");
  if (path == nullptr || *path == '\0') return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (r.failed) return;
  if (!r.loaded) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) r.seen.insert(line);
    r.loaded = true;
  }
  if (!r.seen.insert(kernel_key).second) return;
  // One write() of a whole line with O_APPEND: lines from concurrent processes never interleave.
  const std::string line = kernel_key + "\n";
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == ssize_t(line.size());
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    r.failed = true;
    fmt::print(stderr, "sparsejit: warning: cannot record kernel requests to {} ({}); recording is off\n", path,
               std::strerror(error));
  }
}

}  // namespace sjit::cache
