"""Saving a row's prefix and loading it into another row: host (numpy) and device (OrtValues
through the Pad graph, on the CPU provider) give the same bytes."""

from __future__ import annotations

import numpy as np

from ortserve.engine.kvcache import DeviceKV, HostKV


def filled(kv: HostKV | DeviceKV, data: np.ndarray) -> None:
    kv.allocate(data.shape[1:], 0, 0)  # type: ignore[arg-type]
    for i in range(data.shape[0]):
        if isinstance(kv, HostKV):
            kv.bufs[i][:] = data[i]
        else:
            kv.bufs[i].update_inplace(np.ascontiguousarray(data[i]))


def test_save_then_load_moves_exactly_the_prefix() -> None:
    rng = np.random.default_rng(1)
    data = rng.standard_normal((2, 3, 2, 10, 4)).astype(np.float32)  # buffers, rows, heads, capacity, dim
    host, dev = HostKV(2, np.float32), DeviceKV(2, np.float32, "cpu", ["CPUExecutionProvider"])
    for kv in (host, dev):
        filled(kv, data)
    blocks = {id(kv): kv.save(1, 6) for kv in (host, dev)}  # row 1's first 6 tokens
    assert [b.shape for b in blocks[id(host)]] == [(2, 6, 4)] * 2
    assert [tuple(b.shape()) for b in blocks[id(dev)]] == [(1, 2, 6, 4)] * 2
    for kv in (host, dev):
        kv.allocate((3, 2, 16, 4), 3, 10)  # the cache grew meanwhile: the block still fits any row
        kv.load(blocks[id(kv)], 2, 4)      # a new request reuses the first 4 of them in row 2
    for i in range(2):
        np.testing.assert_array_equal(host.row(i, 2)[:, :4], data[i, 1, :, :4])
        np.testing.assert_array_equal(dev.row(i, 2)[:, :4], data[i, 1, :, :4])
        np.testing.assert_array_equal(host.row(i, 1)[:, :10], data[i, 1])  # the source row is untouched
        np.testing.assert_array_equal(dev.row(i, 1)[:, :10], data[i, 1])


def test_a_host_block_is_one_allocation() -> None:
    """A saved entry is views of one array (one allocation to free at eviction, not 2 x layers small
    ones fragmenting the heap), holding exactly the row's prefix, not a view of the live cache."""
    data = np.random.default_rng(2).standard_normal((4, 2, 2, 8, 4)).astype(np.float32)
    kv = HostKV(4, np.float32)
    filled(kv, data)
    block = kv.save(0, 5)
    assert len({b.base is not None and id(b.base) for b in block}) == 1 and block[0].base is not None
    assert block[0].base.nbytes == 4 * 2 * 5 * 4 * 4
    kv.bufs[0][:] = 0   # the live cache moves on
    for i, b in enumerate(block):
        np.testing.assert_array_equal(b, data[i, 0, :, :5])
