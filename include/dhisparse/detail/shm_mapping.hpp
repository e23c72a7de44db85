#pragma once
/// \file
/// A POSIX shared memory object mapped into this process (Linux): the bytes of an
/// `interprocess_host_store`, whose first bytes are the shared store's books region
/// (shared_store_books.hpp). Created (the name must be new) or opened (the creator must have marked
/// the region ready). The creator's mapping unlinks the name when it goes; every mapping stays
/// valid until it is unmapped, whoever unlinked the name.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include "../errors.hpp"
#include "shared_store_books.hpp"

namespace dhisparse::detail {

class shm_mapping {
 public:
  /// A name as shm_open wants it: one leading '/', no other '/'. Throws invalid_configuration.
  static std::string normalised_name(const std::string& name) {
    std::string n = !name.empty() && name[0] == '/' ? name : "/" + name;
    if (n.size() < 2 || n.size() > 250 || n.find('/', 1) != std::string::npos)
      throw invalid_configuration("shared memory name '" + name + "' must be 1..249 characters without '/' (one leading '/' allowed)");
    return n;
  }
  /// Unlinks `name`; true when it existed. Throws shared_memory_error on another failure.
  static bool remove(const std::string& name) {
    const std::string n = normalised_name(name);
    if (shm_unlink(n.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw shared_memory_error(failure("shm_unlink", n));
  }

  /// Creates `name` of `bytes` bytes (zero-filled) and maps it; shared_memory_error when the name
  /// exists or a call fails (nothing is left behind).
  shm_mapping(const std::string& name, std::size_t bytes) : name_(normalised_name(name)), creator_(true) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      throw shared_memory_error(errno == EEXIST ? "shared memory '" + name_ + "' exists already (remove it, or open it)"
                                                : failure("shm_open", name_));
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string why = failure("ftruncate", name_);
      close(fd);
      shm_unlink(name_.c_str());
      throw shared_memory_error(why);
    }
    map(fd, bytes);
  }
  /// Opens `name`, waiting up to `timeout` for its creator to size it and mark its books ready;
  /// shared_memory_error when it does not exist, is not ready in time or a call fails.
  shm_mapping(const std::string& name, std::chrono::milliseconds timeout) : name_(normalised_name(name)) {
    const int fd = shm_open(name_.c_str(), O_RDWR, 0);
    if (fd < 0)
      throw shared_memory_error(errno == ENOENT ? "shared memory '" + name_ + "' does not exist (create it first)"
                                                : failure("shm_open", name_));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      struct stat st {};
      if (fstat(fd, &st) != 0) {
        const std::string why = failure("fstat", name_);
        close(fd);
        throw shared_memory_error(why);
      }
      if (st.st_size > 0) {
        if (!bytes_.data()) map(fd, static_cast<std::size_t>(st.st_size), false);
        if (shared_store_books::ready(bytes_)) break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        if (fd >= 0) close(fd);
        unmap();
        throw shared_memory_error("shared memory '" + name_ + "' was not initialised by its creator within " +
                                  std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    close(fd);
  }
  shm_mapping(const shm_mapping&) = delete;
  shm_mapping& operator=(const shm_mapping&) = delete;
  ~shm_mapping() {
    unmap();
    if (creator_) shm_unlink(name_.c_str());  // gone already (remove) is fine
  }

  [[nodiscard]] std::span<std::byte> bytes() const { return bytes_; }
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] bool creator() const { return creator_; }

 private:
  static std::string failure(const char* call, const std::string& name) {
    return std::string(call) + " of shared memory '" + name + "' failed: " + std::strerror(errno);
  }
  /// Maps `bytes` of `fd`; closes `fd` when `close_fd` (and on failure, unlinking a created name).
  void map(int fd, std::size_t bytes, bool close_fd = true) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = failure("mmap", name_);
      close(fd);
      if (creator_) shm_unlink(name_.c_str());
      throw shared_memory_error(why);
    }
    if (close_fd) close(fd);  // the mapping outlives the descriptor
    bytes_ = {static_cast<std::byte*>(p), bytes};
  }
  void unmap() noexcept {
    if (bytes_.data()) munmap(bytes_.data(), bytes_.size());
    bytes_ = {};
  }

  std::string name_;
  bool creator_ = false;
  std::span<std::byte> bytes_;
};

}  // namespace dhisparse::detail
