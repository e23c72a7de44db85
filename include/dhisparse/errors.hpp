#pragma once
/// \file
/// Typed errors. Every public host API either succeeds or throws one of these and leaves the
/// hierarchy's state unchanged. Capacity that cannot be covered now is a *wait* status, not an error.
#include <stdexcept>
#include <string>

namespace dhisparse {

/// Machine-readable error category.
enum class errc {
  unknown_request,           ///< request id was never admitted or already completed
  duplicate_admission,       ///< request id is already admitted
  position_out_of_range,     ///< selection entry negative (other than -1) or past the history capacity
  position_beyond_frontier,  ///< selection entry names a row that does not exist yet
  selection_too_long,        ///< more entries than the layout's top_k
  size_mismatch,             ///< a buffer's size does not match the layout or configuration
  invalid_source,            ///< source or payload layer index outside the layout
  capacity_exceeded,         ///< a request's history would exceed the configured row capacity
  host_pool_exhausted,       ///< no free page in the host store
  pending_follower_copies,   ///< a source was resolved again before its follower layers copied the last plan
  duplicate_in_batch,        ///< one request appears twice in a batched call
  invalid_configuration,     ///< configuration values that cannot work together
  device_error,              ///< a CUDA runtime call failed
  // Speculative verification (appended: the CUDA backend encodes errc numerically).
  block_too_wide,            ///< a staged block or a verify round wider than max_block (K_max) or than the staged block
  no_staged_block,           ///< verify of a request/source with no staged block
  position_not_visible,      ///< a verification query selects a position it cannot see (a later block position)
  commit_without_verify,     ///< commit of a request/source with no verify since its last stage_block
  acceptance_beyond_block,   ///< commit accepts more proposals than the verified round had (accepted > K_r - 1)
  packed_rows_unsupported,   ///< no longer thrown (packed sources are speculative); kept: part of the encoded CUDA status
  // Draft ring storage (appended, same reason).
  invalid_slot,              ///< a draft ring slot index at or past the store's slot count
  draft_position_not_live,   ///< a draft ring read of a position older than the window or not written yet
  draft_write_out_of_order,  ///< a draft ring write of a committed position or one past the write frontier
  // Shared staging arenas (appended, same reason).
  staging_in_use,            ///< a verify on one source while another source holds the shared staging arenas
  staging_not_held,          ///< release, or a read of staging rows, by a source that does not hold the arenas
  // Streamed admission (appended, same reason).
  import_after_decode,       ///< history imported on a source after its first decode row (appended, staged or committed)
  // Shared prefixes (appended, same reason).
  unknown_prefix,            ///< prefix id not retained now (never retained, released or evicted)
  duplicate_prefix,          ///< prefix id is already retained
  prefix_budget_exceeded,    ///< a prefix's pages do not fit hierarchy_config::prefix_pages even with every other prefix evicted
  suffix_misaligned,         ///< a suffix imported on a prefix does not start at the prefix's end
  // Shared host stores (appended, same reason).
  host_copy_pending,         ///< a rank needs a row's host copy from a shared host store before its owner rank wrote it
  // Device affinity (appended, same reason).
  wrong_device,              ///< a stream of another device than the one the CUDA object was created on
  // Stores shared across processes (appended, same reason).
  shared_memory_error,       ///< a shared memory call failed: a store's name missing, taken or not initialised, no permission or no memory
  lock_owner_died,           ///< a process died holding a shared host store's lock (mid-update): its books cannot be trusted
};

/// Short name of an error category, for messages and logs.
constexpr const char* to_string(errc e) noexcept {
  switch (e) {
    case errc::unknown_request: return "unknown_request";
    case errc::duplicate_admission: return "duplicate_admission";
    case errc::position_out_of_range: return "position_out_of_range";
    case errc::position_beyond_frontier: return "position_beyond_frontier";
    case errc::selection_too_long: return "selection_too_long";
    case errc::size_mismatch: return "size_mismatch";
    case errc::invalid_source: return "invalid_source";
    case errc::capacity_exceeded: return "capacity_exceeded";
    case errc::host_pool_exhausted: return "host_pool_exhausted";
    case errc::pending_follower_copies: return "pending_follower_copies";
    case errc::duplicate_in_batch: return "duplicate_in_batch";
    case errc::invalid_configuration: return "invalid_configuration";
    case errc::device_error: return "device_error";
    case errc::block_too_wide: return "block_too_wide";
    case errc::no_staged_block: return "no_staged_block";
    case errc::position_not_visible: return "position_not_visible";
    case errc::commit_without_verify: return "commit_without_verify";
    case errc::acceptance_beyond_block: return "acceptance_beyond_block";
    case errc::packed_rows_unsupported: return "packed_rows_unsupported";
    case errc::invalid_slot: return "invalid_slot";
    case errc::draft_position_not_live: return "draft_position_not_live";
    case errc::draft_write_out_of_order: return "draft_write_out_of_order";
    case errc::staging_in_use: return "staging_in_use";
    case errc::staging_not_held: return "staging_not_held";
    case errc::import_after_decode: return "import_after_decode";
    case errc::unknown_prefix: return "unknown_prefix";
    case errc::duplicate_prefix: return "duplicate_prefix";
    case errc::prefix_budget_exceeded: return "prefix_budget_exceeded";
    case errc::suffix_misaligned: return "suffix_misaligned";
    case errc::host_copy_pending: return "host_copy_pending";
    case errc::wrong_device: return "wrong_device";
    case errc::shared_memory_error: return "shared_memory_error";
    case errc::lock_owner_died: return "lock_owner_died";
  }
  return "unknown";
}

/// Base of all dhisparse errors; `code()` tells which rule was broken.
class error : public std::runtime_error {
 public:
  /// An error of category `code`; `what()` is `what` prefixed with "dhisparse: ".
  error(errc code, const std::string& what) : std::runtime_error(std::string("dhisparse: ") + what), code_(code) {}
  /// The error's category.
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

/// One type per category so callers can catch exactly what they handle.
template <errc Code>
class typed_error : public error {
 public:
  /// An error of category `Code` with message `what`.
  explicit typed_error(const std::string& what) : error(Code, what) {}
};

/// Typed errors, one per `errc` value and named after it (see `errc` for what each means).
using unknown_request = typed_error<errc::unknown_request>;
using duplicate_admission = typed_error<errc::duplicate_admission>;
using position_out_of_range = typed_error<errc::position_out_of_range>;
using position_beyond_frontier = typed_error<errc::position_beyond_frontier>;
using selection_too_long = typed_error<errc::selection_too_long>;
using size_mismatch = typed_error<errc::size_mismatch>;
using invalid_source = typed_error<errc::invalid_source>;
using capacity_exceeded = typed_error<errc::capacity_exceeded>;
using host_pool_exhausted = typed_error<errc::host_pool_exhausted>;
using pending_follower_copies = typed_error<errc::pending_follower_copies>;
using duplicate_in_batch = typed_error<errc::duplicate_in_batch>;
using invalid_configuration = typed_error<errc::invalid_configuration>;
using device_error = typed_error<errc::device_error>;
using block_too_wide = typed_error<errc::block_too_wide>;
using no_staged_block = typed_error<errc::no_staged_block>;
using position_not_visible = typed_error<errc::position_not_visible>;
using commit_without_verify = typed_error<errc::commit_without_verify>;
using acceptance_beyond_block = typed_error<errc::acceptance_beyond_block>;
using packed_rows_unsupported = typed_error<errc::packed_rows_unsupported>;
using invalid_slot = typed_error<errc::invalid_slot>;
using draft_position_not_live = typed_error<errc::draft_position_not_live>;
using draft_write_out_of_order = typed_error<errc::draft_write_out_of_order>;
using staging_in_use = typed_error<errc::staging_in_use>;
using staging_not_held = typed_error<errc::staging_not_held>;
using import_after_decode = typed_error<errc::import_after_decode>;
using unknown_prefix = typed_error<errc::unknown_prefix>;
using duplicate_prefix = typed_error<errc::duplicate_prefix>;
using prefix_budget_exceeded = typed_error<errc::prefix_budget_exceeded>;
using suffix_misaligned = typed_error<errc::suffix_misaligned>;
using host_copy_pending = typed_error<errc::host_copy_pending>;
using wrong_device = typed_error<errc::wrong_device>;
using shared_memory_error = typed_error<errc::shared_memory_error>;
using lock_owner_died = typed_error<errc::lock_owner_died>;

/// Throws the typed error that matches `code`.
[[noreturn]] inline void throw_error(errc code, const std::string& what) {
  switch (code) {
    case errc::unknown_request: throw unknown_request(what);
    case errc::duplicate_admission: throw duplicate_admission(what);
    case errc::position_out_of_range: throw position_out_of_range(what);
    case errc::position_beyond_frontier: throw position_beyond_frontier(what);
    case errc::selection_too_long: throw selection_too_long(what);
    case errc::size_mismatch: throw size_mismatch(what);
    case errc::invalid_source: throw invalid_source(what);
    case errc::capacity_exceeded: throw capacity_exceeded(what);
    case errc::host_pool_exhausted: throw host_pool_exhausted(what);
    case errc::pending_follower_copies: throw pending_follower_copies(what);
    case errc::duplicate_in_batch: throw duplicate_in_batch(what);
    case errc::invalid_configuration: throw invalid_configuration(what);
    case errc::device_error: throw device_error(what);
    case errc::block_too_wide: throw block_too_wide(what);
    case errc::no_staged_block: throw no_staged_block(what);
    case errc::position_not_visible: throw position_not_visible(what);
    case errc::commit_without_verify: throw commit_without_verify(what);
    case errc::acceptance_beyond_block: throw acceptance_beyond_block(what);
    case errc::packed_rows_unsupported: throw packed_rows_unsupported(what);
    case errc::invalid_slot: throw invalid_slot(what);
    case errc::draft_position_not_live: throw draft_position_not_live(what);
    case errc::draft_write_out_of_order: throw draft_write_out_of_order(what);
    case errc::staging_in_use: throw staging_in_use(what);
    case errc::staging_not_held: throw staging_not_held(what);
    case errc::import_after_decode: throw import_after_decode(what);
    case errc::unknown_prefix: throw unknown_prefix(what);
    case errc::duplicate_prefix: throw duplicate_prefix(what);
    case errc::prefix_budget_exceeded: throw prefix_budget_exceeded(what);
    case errc::suffix_misaligned: throw suffix_misaligned(what);
    case errc::host_copy_pending: throw host_copy_pending(what);
    case errc::wrong_device: throw wrong_device(what);
    case errc::shared_memory_error: throw shared_memory_error(what);
    case errc::lock_owner_died: throw lock_owner_died(what);
  }
  throw error(code, what);
}

}  // namespace dhisparse
