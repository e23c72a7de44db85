#pragma once
/// \file
/// A barrier of the processes of a test (made before fork(), in anonymous shared memory), with a
/// deadline: a process that failed and left never makes the others hang; they throw instead.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>

namespace dhisparse_testing {

class process_barrier {
 public:
  explicit process_barrier(std::uint32_t processes, std::chrono::seconds deadline = std::chrono::seconds(120))
      : n_(processes), deadline_(deadline) {
    void* p = mmap(nullptr, sizeof(state), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("process_barrier: mmap failed");
    s_ = new (p) state{};
  }
  process_barrier(const process_barrier&) = delete;
  process_barrier& operator=(const process_barrier&) = delete;
  ~process_barrier() { munmap(s_, sizeof(state)); }

  /// Waits for every process; throws std::runtime_error past the deadline.
  void wait() {
    const std::uint32_t gen = s_->generation.load();
    if (s_->arrived.fetch_add(1) + 1 == n_) {
      s_->arrived.store(0);
      s_->generation.fetch_add(1);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + deadline_;
    while (s_->generation.load() == gen) {
      if (std::chrono::steady_clock::now() > until)
        throw std::runtime_error("process_barrier: another process did not arrive (it failed or hangs)");
      std::this_thread::yield();
    }
  }

 private:
  struct state {
    std::atomic<std::uint32_t> arrived{0}, generation{0};
  };
  static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "the barrier's words are shared between processes");
  std::uint32_t n_;
  std::chrono::seconds deadline_;
  state* s_ = nullptr;
};

}  // namespace dhisparse_testing
