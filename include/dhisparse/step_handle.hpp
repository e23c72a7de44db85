#pragma once
/// \file
/// `dhisparse::step_handle<Hierarchy>`: what an engine's decode step may do to a hierarchy that a
/// residency manager owns (host `residency_manager::step()`, CUDA `cuda::residency_manager::step()`).
///
/// A residency manager keeps books (the ledger, every request's optional pages, page states on the
/// GPU) that must agree with its hierarchy, so it hands out the hierarchy read-only and this handle
/// for the per-step operations: resolve, follower copies, the speculative round (stage, stage_blocks,
/// stage_step, verify, commit, commit_step, release staging), joining the host backup of step-wide writes, and error checks. None of them admits, completes, maps or unmaps, so
/// none can put the books out of step; admission, history import, decode-row appends (which may
/// map pinned pages), completion and repopulation stay on the manager.
///
/// Every member forwards its arguments unchanged to the hierarchy member of the same name, so each
/// keeps that member's overloads, stream-last signatures, defaults and errors (see host/hierarchy.hpp
/// and cuda/hierarchy.cuh). A member exists in a backend only when the hierarchy has it (a
/// forwarding template is instantiated only when called). Adding a per-step member of a hierarchy
/// here is one line of the same form.
#include <utility>

namespace dhisparse {

/// Per-step operations on a hierarchy owned by a residency manager (see the file comment). A
/// non-owning handle: valid while the manager lives; cheap to copy.
template <class Hierarchy>
class step_handle {
 public:
  /// The hierarchy type the handle forwards to.
  using hierarchy_type = Hierarchy;

  /// A handle on `h`. Managers make them (`step()`); a handle gives no more than its members.
  explicit step_handle(Hierarchy& h) noexcept : h_(&h) {}

  /// The hierarchy, read-only (the same object as the manager's `hierarchy()`).
  [[nodiscard]] const Hierarchy& hierarchy() const noexcept { return *h_; }

#define DHISPARSE_STEP_FORWARD(name)                                                           \
  template <class... Args>                                                                    \
  decltype(auto) name(Args&&... args) const {                                                 \
    return h_->name(std::forward<Args>(args)...);                                             \
  }

  // Resolution (hierarchy::resolve, resolve_sync, copy_follower).
  /// Forwards to the hierarchy's `resolve` (every overload).
  DHISPARSE_STEP_FORWARD(resolve)
  /// Forwards to the hierarchy's `resolve_sync` (CUDA).
  DHISPARSE_STEP_FORWARD(resolve_sync)
  /// Forwards to the hierarchy's `copy_follower`.
  DHISPARSE_STEP_FORWARD(copy_follower)

  // Speculative rounds (docs/speculative.md).
  /// Forwards to the hierarchy's `stage_block`.
  DHISPARSE_STEP_FORWARD(stage_block)
  /// Forwards to the hierarchy's `stage_blocks` (the batched stage of one source).
  DHISPARSE_STEP_FORWARD(stage_blocks)
  /// Forwards to the hierarchy's `stage_step` (the batched stage of every source).
  DHISPARSE_STEP_FORWARD(stage_step)
  /// Forwards to the hierarchy's `verify` (every overload).
  DHISPARSE_STEP_FORWARD(verify)
  /// Forwards to the hierarchy's `verify_sync` (CUDA).
  DHISPARSE_STEP_FORWARD(verify_sync)
  /// Forwards to the hierarchy's `commit`.
  DHISPARSE_STEP_FORWARD(commit)
  /// Forwards to the hierarchy's `commit_step` (the step-wide commit of every source).
  DHISPARSE_STEP_FORWARD(commit_step)
  /// Forwards to the hierarchy's `join_backup` (CUDA: joins the host backup of a step-wide write or
  /// commit into a stream; host: nothing to join).
  DHISPARSE_STEP_FORWARD(join_backup)
  /// Forwards to the hierarchy's `backup_pending`.
  DHISPARSE_STEP_FORWARD(backup_pending)
  /// Forwards to the hierarchy's `release_staging`.
  DHISPARSE_STEP_FORWARD(release_staging)

  // Device-side errors and views (CUDA).
  /// Forwards to the hierarchy's `check_errors` (CUDA).
  DHISPARSE_STEP_FORWARD(check_errors)
  /// Forwards to the hierarchy's `view` (CUDA: the device view of a source).
  DHISPARSE_STEP_FORWARD(view)
  /// Forwards to the hierarchy's `workspace` (CUDA).
  DHISPARSE_STEP_FORWARD(workspace)
  /// Forwards to the hierarchy's `verify_workspace` (CUDA).
  DHISPARSE_STEP_FORWARD(verify_workspace)
  /// Forwards to the hierarchy's `pool` (CUDA: device pointer of a payload layer's pool).
  DHISPARSE_STEP_FORWARD(pool)

#undef DHISPARSE_STEP_FORWARD

 private:
  Hierarchy* h_;
};

}  // namespace dhisparse
