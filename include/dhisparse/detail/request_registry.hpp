#pragma once
/// \file
/// Maps the engine's request ids to request slots. Free slots are handed out lowest first so
/// that slot assignment is deterministic on both backends.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "../errors.hpp"
#include "../types.hpp"

namespace dhisparse::detail {

class request_registry {
 public:
  explicit request_registry(std::size_t slots = 0) : live_(slots, false) {
    for (std::size_t i = slots; i-- > 0;) free_.push_back(i);
  }

  [[nodiscard]] std::size_t capacity() const { return live_.size(); }
  [[nodiscard]] std::size_t size() const { return slot_of_.size(); }
  [[nodiscard]] bool contains(request_id id) const { return slot_of_.contains(id); }
  [[nodiscard]] bool slot_live(std::size_t slot) const { return slot < live_.size() && live_[slot]; }

  /// Slot of an admitted request; throws unknown_request otherwise.
  [[nodiscard]] std::size_t slot(request_id id) const {
    auto it = slot_of_.find(id);
    if (it == slot_of_.end()) throw unknown_request("request " + std::to_string(id) + " is not admitted");
    return it->second;
  }

  /// Takes the lowest free slot; nullopt when every slot is in use (the caller waits).
  /// Throws duplicate_admission when the id is already admitted.
  std::optional<std::size_t> admit(request_id id) {
    if (contains(id)) throw duplicate_admission("request " + std::to_string(id) + " is already admitted");
    if (free_.empty()) return std::nullopt;
    std::size_t s = free_.back();
    free_.pop_back();
    slot_of_.emplace(id, s);
    live_[s] = true;
    return s;
  }

  /// Releases the request's slot and returns it; throws unknown_request.
  std::size_t release(request_id id) {
    std::size_t s = slot(id);
    slot_of_.erase(id);
    live_[s] = false;
    free_.push_back(s);
    std::sort(free_.begin(), free_.end(), std::greater<>());  // keep "lowest first"
    return s;
  }

  /// Admitted (id, slot) pairs in slot order.
  [[nodiscard]] std::vector<std::pair<request_id, std::size_t>> admitted() const {
    std::vector<std::pair<request_id, std::size_t>> v(slot_of_.begin(), slot_of_.end());
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second < b.second; });
    return v;
  }

 private:
  std::unordered_map<request_id, std::size_t> slot_of_;
  std::vector<std::size_t> free_;  // descending, so back() is the lowest
  std::vector<bool> live_;
};

}  // namespace dhisparse::detail
