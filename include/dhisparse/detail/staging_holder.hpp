#pragma once
/// \file
/// Which source holds the shared staging arenas (`staging_arenas<chi>`), with the checks both
/// hierarchies make before a verify, a release or a read of staging rows. With
/// `dedicated_staging` every source owns its staging rows: every check passes and nothing is held.
#include <cstddef>
#include <optional>
#include <string>

#include "../errors.hpp"
#include "../policies/staging_arena.hpp"

namespace dhisparse::detail {

template <StagingArenaPolicy Staging>
class staging_holder {
 public:
  /// Source holding the arenas, if any (always empty for dedicated staging).
  [[nodiscard]] std::optional<std::size_t> holder() const { return holder_; }

  /// A verify on `source` may write staging rows: no other source holds the arenas.
  void check_verify(std::size_t source) const {
    if constexpr (Staging::shared)
      if (holder_ && *holder_ != source)
        throw staging_in_use("verify on source " + std::to_string(source) + " needs the shared staging arenas, held by source " +
                             std::to_string(*holder_) + " until release_staging(" + std::to_string(*holder_) +
                             ") says its attention consumers have finished");
  }
  /// After a successful verify on `source`.
  void acquire(std::size_t source) {
    if constexpr (Staging::shared) holder_ = source;
  }
  /// A release by `source`: it must hold the arenas.
  void check_release(std::size_t source) const {
    if constexpr (Staging::shared)
      if (holder_ != source)
        throw staging_not_held("release_staging(" + std::to_string(source) + "): " +
                               (holder_ ? "the shared staging arenas are held by source " + std::to_string(*holder_)
                                        : std::string("no source holds the shared staging arenas")));
  }
  void release() { holder_.reset(); }
  /// A read of `source`'s staging rows: they only exist while it holds the arenas.
  void check_read(std::size_t source) const {
    if constexpr (Staging::shared)
      if (holder_ != source)
        throw staging_not_held("staging rows of source " + std::to_string(source) +
                               " are not held: they are valid from its verify until its release_staging");
  }

 private:
  std::optional<std::size_t> holder_;
};

}  // namespace dhisparse::detail
