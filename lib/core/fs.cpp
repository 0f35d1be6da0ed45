#include "core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace swiftcpp {

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail<IoError>("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail<IoError>("error while reading '{}'", path.string());
  return buffer.str();
}

namespace {
std::atomic<int> temp_counter{0};
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  temp_ = path_;
  temp_ += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter++);
  out_.open(temp_, std::ios::binary | std::ios::trunc);
  if (!out_) fail<IoError>("cannot create '{}': {}", temp_.string(), std::strerror(errno));
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
  if (!out_) fail<IoError>("error while writing '{}'", temp_.string());
  out_.close();
  const int fd = ::open(temp_.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  std::error_code ec;
  fs::rename(temp_, path_, ec);
  if (ec) fail<IoError>("cannot rename '{}' to '{}': {}", temp_.string(), path_.string(), ec.message());
  committed_ = true;
}

void write_file_atomic(const fs::path& path, const std::string& content) {
  AtomicFile file(path);
  file.stream().write(content.data(), static_cast<std::streamsize>(content.size()));
  file.commit();
}

}  // namespace swiftcpp
