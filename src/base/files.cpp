// base/files.h: the regular-file check and the capped read, before any byte of a file is read.
#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "qspec/error.h"

namespace qspec {

int open_regular_file(const std::string& path, uint64_t* size_out) {
  // stat() first: an open() of a FIFO without O_NONBLOCK waits for a writer forever, and
  // opening some devices has side effects.
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (!S_ISREG(info.st_mode)) fail(path, ": not a regular file");
  // The path may have been swapped between stat() and open(): O_NONBLOCK keeps a FIFO from
  // blocking, and fstat() checks what was actually opened.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (::fstat(fd, &info) != 0) {
    const int error_number = errno;
    ::close(fd);
    fail(path, ": cannot stat: ", std::strerror(error_number));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file");
  }
  if (size_out) *size_out = static_cast<uint64_t>(info.st_size);
  return fd;
}

std::string read_text_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  if (size > max_bytes) {
    ::close(fd);
    fail(path, ": file of ", size, " bytes is larger than the ", max_bytes, " bytes allowed for it");
  }
  std::string text(static_cast<size_t>(size), '\0');
  size_t done = 0;
  // Read to end of file, never past max_bytes (the file may grow while it is read).
  char scratch[1];
  while (true) {
    char* target = done < text.size() ? text.data() + done : scratch;
    const size_t want = done < text.size() ? text.size() - done : 1;
    const ssize_t got = ::read(fd, target, want);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(fd);
      fail(path, ": read failed: ", std::strerror(error_number));
    }
    if (got == 0) break;
    if (target == scratch) {
      ::close(fd);
      fail(path, ": grew while being read (now over its ", size, " bytes)");
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  text.resize(done);  // shrank while being read: what is there
  return text;
}

std::vector<std::string> sorted_json_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code error;
  if (!fs::is_directory(dir, error)) return files;
  for (const auto& item : fs::directory_iterator(dir, error))
    if (item.path().extension() == ".json") files.push_back(item.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::string file_name_slug(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) out += static_cast<char>(std::tolower(c));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

}  // namespace qspec
