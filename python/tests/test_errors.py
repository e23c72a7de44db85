"""Every errc reachable from Python raises its own class (all deriving from DhisparseError) with
the C++ message, and leaves the state unchanged."""
import os

import numpy as np
import pytest

import dhisparse

# Not reachable through these bindings: device_error needs a failing CUDA call; packed_rows_unsupported
# is no longer thrown by the library; the draft ring store and shared staging arenas are not bound;
# suffix_misaligned cannot happen because the binding starts a suffix where its prefix ends;
# wrong_device needs a CUDA stream of another GPU than the hierarchy's; lock_owner_died needs a
# process to die inside a call on an interprocess store (holding its lock), which no Python code
# runs within, so a test cannot place the death there.
UNREACHABLE = {"DeviceError", "PackedRowsUnsupported", "InvalidSlot", "DraftPositionNotLive",
               "DraftWriteOutOfOrder", "StagingInUse", "StagingNotHeld", "SuffixMisaligned",
               "WrongDevice", "LockOwnerDied"}

raised = set()


def expect(cls, fn, match=None):
    with pytest.raises(cls, match=match) as info:
        fn()
    assert type(info.value) is cls  # the exact class, not only a base
    assert str(info.value).startswith("dhisparse: ")
    raised.add(cls.__name__)
    return info.value


def hierarchy(**kw):
    cfg = {"max_requests": 2, "max_rows": 64}
    cfg.update(kw)
    h = dhisparse.Hierarchy("tiny", cfg)
    h.admit(1)
    h.append(1, 0, np.zeros((2, 20, 64), np.uint8))
    h.append(1, 1, np.zeros((1, 20, 32), np.uint8))
    return h


def resolve(h, sel, requests=(1,), source=0):
    sel = np.asarray(sel, dtype=np.int32).reshape(len(requests), -1)
    return h.resolve(source, list(requests), sel, np.zeros_like(sel))


def test_class_hierarchy():
    assert issubclass(dhisparse.DhisparseError, RuntimeError)
    assert len(dhisparse.ERRORS) == 33
    for name, cls in dhisparse.ERRORS.items():
        assert issubclass(cls, dhisparse.DhisparseError)
        assert cls.__name__ == name and cls.__module__ == "dhisparse"
        assert "".join(p.capitalize() for p in cls.code.split("_")) == name


def test_hierarchy_errors():
    h = hierarchy()
    e = expect(dhisparse.UnknownRequest, lambda: h.complete(99))
    assert str(e) == "dhisparse: request 99 is not admitted" and e.code == "unknown_request"
    expect(dhisparse.DuplicateAdmission, lambda: h.admit(1), "request 1 is already admitted")
    expect(dhisparse.PositionOutOfRange, lambda: resolve(h, [0, -5]))
    expect(dhisparse.PositionOutOfRange, lambda: resolve(h, [64]))
    expect(dhisparse.PositionBeyondFrontier, lambda: resolve(h, [20]))
    expect(dhisparse.SelectionTooLong, lambda: resolve(h, list(range(17))), "top_k is 16")
    expect(dhisparse.SizeMismatch, lambda: h.append(1, 0, np.zeros(65, np.uint8), count=1), "expected 128")
    # Without a count, a size that is no whole number of rows names the row size, not "0 rows".
    expect(dhisparse.SizeMismatch, lambda: h.append(1, 0, np.zeros((2, 1, 60), np.uint8)),
           r"120 bytes is not a whole number of rows of 2 payload layers x 64 bytes \(128 bytes a row\)")
    assert h.frontier(1, 0) == 20
    expect(dhisparse.InvalidSource, lambda: resolve(h, [0], source=2))
    expect(dhisparse.InvalidSource, lambda: h.pool(0, 2))
    expect(dhisparse.CapacityExceeded, lambda: h.append(1, 1, np.zeros((1, 45, 32), np.uint8)))
    h.admit(2)
    expect(dhisparse.DuplicateInBatch, lambda: resolve(h, [[0], [1]], requests=(1, 1)))
    expect(dhisparse.InvalidConfiguration, lambda: dhisparse.Hierarchy("tiny", {"max_rows": 0}))
    expect(dhisparse.InvalidConfiguration, lambda: dhisparse.Hierarchy("tiny", {"max_rows": 8, "max_block": 0}))
    small = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64, "host_pages": 2})
    small.admit(1)
    expect(dhisparse.HostPoolExhausted, lambda: small.append(1, 1, np.zeros((1, 17, 32), np.uint8)))
    resolve(h, [1, 2], source=0)  # producer_only leaves the follower layer pending
    h.resolve(0, [1], np.array([[3]], np.int32), np.zeros((1, 1), np.int32), mode=dhisparse.CopyLayers.producer_only)
    expect(dhisparse.PendingFollowerCopies, lambda: resolve(h, [4]))
    h.copy_follower(0, 1)
    expect(dhisparse.InvalidSource, lambda: h.copy_follower(0, 0), "not a follower")


def test_speculative_errors():
    h = hierarchy(max_block=3)
    rows = np.zeros((2, 3, 64), np.uint8)
    q = np.full((1, 3, 2), -1, np.int32)
    loc = np.zeros_like(q)
    expect(dhisparse.NoStagedBlock, lambda: h.verify(0, [1], q, loc))
    expect(dhisparse.BlockTooWide, lambda: h.stage_block(1, 0, np.zeros((2, 4, 64), np.uint8), 4))
    h.stage_block(1, 0, rows, 3)
    expect(dhisparse.CommitWithoutVerify, lambda: h.commit(1, 0, 0))
    bad = q.copy()
    bad[0, 0, 0] = 21  # the anchor (position 20) cannot see position 21
    expect(dhisparse.PositionNotVisible, lambda: h.verify(0, [1], bad, loc))
    wide = np.full((1, 4, 2), -1, np.int32)
    expect(dhisparse.BlockTooWide, lambda: h.verify(0, [1], wide, np.zeros_like(wide)))
    h.verify(0, [1], q, loc)
    expect(dhisparse.AcceptanceBeyondBlock, lambda: h.commit(1, 0, 3), "the verified round had 2")
    plain = hierarchy()
    expect(dhisparse.InvalidConfiguration, lambda: plain.stage_block(1, 0, rows, 3), "max_block >= 2")


def test_residency_errors():
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 2, "max_rows": 64, "optional_pages": 8},
                                   {"required_pages": 1})
    m.admit(1)
    expect(dhisparse.DuplicateAdmission, lambda: m.admit(1), "residency: request 1")
    expect(dhisparse.UnknownRequest, lambda: m.complete(7))
    expect(dhisparse.SizeMismatch, lambda: m.admit(2, [np.zeros((2, 1, 64), np.uint8)]), "imports history for 1")
    expect(dhisparse.CapacityExceeded, lambda: m.admit(2, [np.zeros((2, 65, 64), np.uint8),
                                                           np.zeros((1, 1, 32), np.uint8)]))
    expect(dhisparse.InvalidSource, lambda: m.ledger(2))
    expect(dhisparse.InvalidConfiguration, lambda: dhisparse.ResidencyManager(
        "tiny", {"max_rows": 64, "optional_pages": 2}, {"required_pages": 3}))
    m.append(1, 0, np.zeros((2, 1, 64), np.uint8))
    expect(dhisparse.ImportAfterDecode, lambda: m.import_history(1, 0, np.zeros((2, 4, 64), np.uint8)),
           "has decode rows on source 0")
    assert m.imported_rows(1, 0) == 0
    assert not m.contains(2) and m.audit() == ""


def test_prefix_errors():
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64, "prefix_pages": 2})
    h.admit(1)
    h.append(1, 0, np.zeros((2, 24, 64), np.uint8))
    expect(dhisparse.UnknownPrefix, lambda: h.admit(2, prefix=5), "prefix 5")
    expect(dhisparse.PrefixBudgetExceeded, lambda: h.retain_prefix(5, 1))  # 3 pages, budget 2
    h.retain_prefix(5, 1, rows=[16, 0])
    expect(dhisparse.DuplicatePrefix, lambda: h.retain_prefix(5, 1, rows=[8, 0]))
    assert h.retained_prefixes() == [5] and not h.contains(2)


def test_shared_store_errors():
    store = dhisparse.SharedHostStore("tiny", 2, 16)
    h0, h1 = (dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64}, store=store, rank=r) for r in (0, 1))
    expect(dhisparse.InvalidConfiguration, lambda: dhisparse.Hierarchy("tiny", {"max_rows": 64}, store=store, rank=1),
           "rank 1 of the shared host store already has a hierarchy")
    h1.admit(1)
    h1.append(1, 1, np.zeros((1, 24, 32), np.uint8))  # page 0 is rank 0's, which has not written it
    e = expect(dhisparse.HostCopyPending, lambda: resolve(h1, [0], source=1))
    assert e.code == "host_copy_pending"
    h0.admit(1)
    h0.append(1, 1, np.zeros((1, 24, 32), np.uint8))
    resolve(h1, [0], source=1)  # the owner wrote it: the same read succeeds
    name = f"/dhisparse-pytest-errors-{os.getpid()}"
    try:
        ipc = dhisparse.InterprocessHostStore.create("tiny", name, 2, 16)
        expect(dhisparse.SharedMemoryError, lambda: dhisparse.InterprocessHostStore.create("tiny", name, 2, 16),
               "exists already")
        expect(dhisparse.SharedMemoryError, lambda: dhisparse.InterprocessHostStore.open("tiny", name + "-x", timeout_ms=0),
               "does not exist")
        assert ipc.creator
    finally:
        dhisparse.InterprocessHostStore.remove(name)


def test_errors_leave_state_unchanged():
    h = hierarchy()
    h.admit(2)
    h.append(2, 0, np.zeros((2, 20, 64), np.uint8))
    sel = np.array([[0, 1], [2, 20]], np.int32)  # request 2's entry 20 is beyond its frontier
    loc = np.full_like(sel, 777)
    before = (h.hot_rows_of(1, 0), h.lru_order_of(1, 0), h.frontier(1, 0))
    with pytest.raises(dhisparse.PositionBeyondFrontier):
        h.resolve(0, [1, 2], sel, loc)
    assert (loc == 777).all()
    assert (h.hot_rows_of(1, 0), h.lru_order_of(1, 0), h.frontier(1, 0)) == before


def test_every_reachable_error_was_raised():
    """Runs last in this file: the tests above raised every class but the unreachable ones."""
    assert raised == set(dhisparse.ERRORS) - UNREACHABLE, sorted(set(dhisparse.ERRORS) - UNREACHABLE - raised)
