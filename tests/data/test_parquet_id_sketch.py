"""The seen-id Bloom filter: never a false negative, the false-positive rate it states,
its bytes read back; the workers' adds under the filters' locks."""

import threading

import numpy as np
import pytest

from data.parquet.id_collisions import each_locked
from data.parquet.id_hashing import integer_keys
from data.parquet.id_sketch import (
    BITS_PER_ID,
    HASHES,
    IdSketch,
    SeenIds,
    sketch_bits,
    sketch_facts,
    sketches_from_bytes,
    sketches_to_bytes,
    widened,
)


def test_added_ids_are_found_and_new_ones_at_the_stated_rate():
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**63, 50_000).astype(np.uint64))
    sketch = IdSketch.of(keys)
    assert sketch.bits == sketch_bits(len(keys)) >= BITS_PER_ID * len(keys) and sketch.ids == len(keys)
    assert sketch.contains(keys).all()  # no false negative
    fresh = rng.integers(0, 2**63, 400_000).astype(np.uint64)
    stated = sketch.false_positive_rate()
    assert stated >= sketch.fill() ** HASHES and 0 < stated < 0.003  # blocks fill unevenly: above fill**k
    assert sketch.contains(fresh).mean() == pytest.approx(stated, rel=0.25)


def test_bytes_round_trip_and_a_wrong_size_is_refused():
    a = IdSketch.of(integer_keys(np.arange(10)))
    b = IdSketch.of(integer_keys(np.arange(5000)))
    data = sketches_to_bytes([a, b])
    back = sketches_from_bytes(data, [a.bits, b.bits], [10, 5000])
    assert back is not None and [s.packed.tolist() for s in back] == [a.packed.tolist(), b.packed.tolist()]
    assert sketches_from_bytes(data[:-1], [a.bits, b.bits], [10, 5000]) is None
    assert sketches_from_bytes(data, [a.bits, a.bits], [10, 10]) is None


def test_seen_ids_fed_by_the_collision_counter_and_merged_over_ranks():
    from data.parquet.id_collisions import CollisionCounter
    from data.parquet.id_sketch import SeenIds, rows_bits, seen_ids_counter

    seen, other = SeenIds(["s", "m"], [10, 5000]), SeenIds(["s", "m"], [10, 5000])
    assert seen.bits == [rows_bits(10), rows_bits(5000)] == [2**16, 2**19]
    counter = seen_ids_counter(seen, ["s", "m"], [10, 5000], "hash", 0)
    assert isinstance(counter, CollisionCounter)
    counter.add([integer_keys(np.arange(3)), integer_keys(np.arange(100, 1100))])
    other.add([integer_keys(np.arange(3, 6)), integer_keys(np.arange(0))])
    assert counter.statistics()["m"]["distinct"] == 1000  # still the collision counter
    seen.merge(other.packed())
    s, m = seen.sketches()
    assert s.contains(integer_keys(np.arange(6))).all() and m.contains(integer_keys(np.arange(100, 1100))).all()
    assert not s.contains(integer_keys(np.arange(50, 90))).any()
    assert (s.ids, m.ids) == (6, pytest.approx(1000, rel=0.02))  # estimated from the fill
    facts = sketch_facts(["s", "m"], [s, m])
    assert facts["hashes"] == HASHES and facts["bits"] == {"s": 2**16, "m": 2**19}
    assert 0 < facts["false_positive_rate"]["m"] < 1e-4


def test_a_filter_widened_for_a_grown_table_still_holds_every_id():
    """A warm start whose tables grew ORs the origin's narrower filters in, tiled."""
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 2**63, 5_000).astype(np.uint64))
    seen = SeenIds(["C1", "C2"], [100, 100])
    seen.add([keys, keys[:10]])
    grown = SeenIds(["C1", "C2"], [100_000, 100])  # C1 grew: its filter is wider
    assert grown.bits[0] == 128 * seen.bits[0] and grown.bits[1] == seen.bits[1]
    grown.merge(widened(seen.packed(), grown.bits))
    wide, same = grown.sketches()
    assert wide.contains(keys).all() and same.contains(keys[:10]).all()  # no id of the origin lost
    fresh = rng.integers(0, 2**63, 50_000).astype(np.uint64)
    assert wide.contains(fresh).mean() == pytest.approx(seen.sketches()[0].contains(fresh).mean(), abs=0.01)
    with pytest.raises(ValueError, match="cannot widen"):
        widened(grown.packed(), seen.bits)


def test_each_locked_works_under_every_lock_once_taking_freed_ones_before_waiting():
    """The workers' adds (SeenIds, the collision counter): busy locks are tried again
    while any other was free, and waited for only when none is; every index once."""
    locks = [threading.Lock() for _ in range(4)]
    locks[0].acquire()  # held by other workers
    locks[1].acquire()
    order: list[int] = []

    def work(i: int) -> None:
        assert locks[i].locked()  # under its lock
        order.append(i)
        if i == 2:
            locks[1].release()  # freed while this one works: taken next, before any wait
        if i == 1:
            locks[0].release()

    runner = threading.Thread(target=each_locked, args=(locks, work, 0), daemon=True)
    runner.start()
    runner.join(timeout=10)
    assert not runner.is_alive() and order == [2, 3, 1, 0]
    assert not any(lock.locked() for lock in locks)
    locks[3].acquire()
    threading.Timer(0.2, locks[3].release).start()  # none free but the busy one: it waits
    order.clear()
    each_locked(locks[3:], order.append)
    assert order == [0]
    features = [threading.Lock() for _ in range(26)]
    starts = []
    for _ in range(3):  # calls close together start far apart (a fifth of the way round at least)
        order.clear()
        each_locked(features, order.append)
        assert order == [(order[0] + k) % 26 for k in range(26)]
        starts.append(order[0])
    for a, b in ((0, 1), (1, 2), (0, 2)):
        assert min((starts[a] - starts[b]) % 26, (starts[b] - starts[a]) % 26) >= 5
