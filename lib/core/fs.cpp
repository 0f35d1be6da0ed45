#include "core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace swiftcpp {

namespace {

// What a non-regular file is, for messages: "a folder", "a FIFO", ...
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

// errno of a failed stat/open, for messages; a symbolic link loop is said as such.
std::string reason(int err) {
  if (err == ELOOP) return fmt::format("a loop of symbolic links ({})", std::strerror(err));
  return std::strerror(err);
}

// The nearest existing ancestor of `path` when it is not a folder (the regular file in the way of "file/x"), said
// as "'file' is a regular file, not a folder"; empty when there is none.
std::string blocking_ancestor(const fs::path& path) {
  for (fs::path p = path.parent_path(); !p.empty(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return {};
      return fmt::format("'{}' is {}, not a folder", p.string(), file_kind(st.st_mode));
    }
    if (p == p.parent_path()) break;
  }
  return {};
}

std::atomic<int> temp_counter{0};

}  // namespace

void require_regular_file(const fs::path& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string in_the_way = err == ENOTDIR ? blocking_ancestor(path) : std::string();
    if (!in_the_way.empty()) fail<IoError>("cannot open {} '{}': {}", what, path.string(), in_the_way);
    fail<IoError>("cannot open {} '{}': {}", what, path.string(), reason(err));
  }
  if (!S_ISREG(st.st_mode)) {
    fail<IoError>("cannot open {} '{}': it is {}, not a regular file", what, path.string(), file_kind(st.st_mode));
  }
}

namespace {

// What check_output_file and check_output_folder share: whatever is at `path` must be a folder (`folder`) or a
// regular file (otherwise), or nothing; an ancestor that is not a folder is named.
void check_output_path(const fs::path& path, std::string_view what, bool folder) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (folder ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
      fail<IoError>("cannot write {} '{}': it exists and is {}, not {} (refusing to replace it)", what,
                    path.string(), file_kind(st.st_mode), folder ? "a folder" : "a regular file");
    }
    return;
  }
  const int err = errno;
  if (err == ENOENT) return;  // nothing there (or a dangling link); a missing folder fails when the output is created
  const std::string in_the_way = err == ENOTDIR ? blocking_ancestor(path) : std::string();
  if (!in_the_way.empty()) fail<IoError>("cannot write {} '{}': {}", what, path.string(), in_the_way);
  fail<IoError>("cannot write {} '{}': {}", what, path.string(), reason(err));
}

}  // namespace

void check_output_file(const fs::path& path, std::string_view what) { check_output_path(path, what, false); }

void check_output_folder(const fs::path& dir, std::string_view what) { check_output_path(dir, what, true); }

void create_folders(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    fail<IoError>("cannot create folder '{}': it exists and is {}", dir.string(), file_kind(st.st_mode));
  }
  const std::string in_the_way = blocking_ancestor(dir);
  if (!in_the_way.empty()) fail<IoError>("cannot create folder '{}': {}", dir.string(), in_the_way);
  fail<IoError>("cannot create folder '{}': {}", dir.string(), ec.message());
}

void replace_folder(const fs::path& temp, const fs::path& dest) {
  struct stat st {};
  if (::stat(dest.c_str(), &st) != 0) {
    const int err = errno;
    if (err != ENOENT) fail<IoError>("cannot replace '{}': {}", dest.string(), reason(err));
    if (::rename(temp.c_str(), dest.c_str()) != 0) {
      const int rename_err = errno;
      fail<IoError>("cannot rename '{}' to '{}': {}", temp.string(), dest.string(), std::strerror(rename_err));
    }
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    fail<IoError>("cannot replace '{}': it exists and is {}, not a folder (refusing to replace it)", dest.string(),
                  file_kind(st.st_mode));
  }
  std::error_code ignored;
  if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(temp, ignored);  // now the old folder
    return;
  }
  const int err = errno;
  if (err != EINVAL && err != ENOSYS && err != ENOTSUP) {
    fail<IoError>("cannot exchange '{}' with '{}': {}", temp.string(), dest.string(), std::strerror(err));
  }
  // The file system cannot exchange: move the old folder aside, put the new one in, then drop the old one.
  fs::path old = temp;
  old += ".old";
  fs::remove_all(old, ignored);
  if (::rename(dest.c_str(), old.c_str()) != 0) {
    const int aside_err = errno;
    fail<IoError>("cannot replace '{}': {}", dest.string(), std::strerror(aside_err));
  }
  if (::rename(temp.c_str(), dest.c_str()) != 0) {
    const int rename_err = errno;
    ::rename(old.c_str(), dest.c_str());  // put the old folder back
    fail<IoError>("cannot rename '{}' to '{}': {}", temp.string(), dest.string(), std::strerror(rename_err));
  }
  fs::remove_all(old, ignored);
}

std::string read_text_file(const fs::path& path) {
  require_regular_file(path);
  // O_NONBLOCK: a FIFO swapped in after the check is not waited on (fstat below refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail<IoError>("cannot open '{}': {}", path.string(), reason(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail<IoError>("cannot open '{}': not a regular file", path.string());
  }
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail<IoError>("error while reading '{}': {}", path.string(), std::strerror(err));
    }
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  check_output_file(path_);
  temp_ = path_;
  temp_ += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter++);
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_) {
    const int err = errno;
    fail<IoError>("cannot write '{}': cannot create its temporary file '{}': {}", path_.string(), temp_.string(),
                  std::strerror(err));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) {
    out_.close();
    std::error_code ignored;
    fs::remove(temp_, ignored);
  }
}

void AtomicFile::commit() {
  out_.flush();
  if (!out_) fail<IoError>("error while writing '{}' (temporary file '{}')", path_.string(), temp_.string());
  out_.close();
  if (out_.fail()) fail<IoError>("error while closing '{}' (temporary file '{}')", path_.string(), temp_.string());
  const int fd = ::open(temp_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  check_output_file(path_);  // still nothing or a regular file
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    fail<IoError>("cannot rename '{}' to '{}': {}", temp_.string(), path_.string(), std::strerror(err));
  }
  committed_ = true;
}

void write_file_atomic(const fs::path& path, const std::string& content) {
  AtomicFile file(path);
  file.stream().write(content.data(), static_cast<std::streamsize>(content.size()));
  file.commit();
}

}  // namespace swiftcpp
