"""The simulator's parts: unit hashes, the KV cache model, the engine's timing, the timeline, calibrations."""

import array
import json

import pytest

from sgl_moe.router.request.block_hash import block_hash_chain, block_hashes
from sgl_moe.simulator import Calibration, SimUnit, UnitStream, cpu_tiny, h100_30b, kv_cache, load
from sgl_moe.simulator.engine import Engine, SharedCompute
from sgl_moe.simulator.kv_cache import KVCacheModel
from sgl_moe.simulator.timeline import Timeline
from sgl_moe.workloads import WorkloadConfig


@pytest.mark.parametrize("token_ids", ["real", "derived"])
def test_unit_hashes_are_the_routers_block_hashes_of_the_units_tokens(token_ids):
    stream = UnitStream(WorkloadConfig(requests=300, seed=1), token_ids=token_ids)
    units = list(stream)
    for u in units:
        ids = array.array("I")
        for seg in u.segments:
            ids.extend(stream.ids(seg))
        assert len(ids) == u.tokens
        assert u.hashes == block_hashes(ids, 16)
    assert stream.units == len(units) and stream.prompt_tokens == sum(u.tokens for u in units)


def test_hash_chain_continues_across_a_page_boundary():
    ids = list(range(1000, 1000 + 83))
    head, digest = block_hash_chain(ids[:48], 16)
    tail, _ = block_hash_chain(ids[48:], 16, digest)
    assert head + tail == block_hashes(ids, 16)


@pytest.mark.parametrize("model", ["python", "c"])
def test_kv_cache_evicts_least_recent_leaves_first_and_respects_locks(model):
    if model == "c" and not kv_cache.NATIVE:
        pytest.skip("native_kv_cache was not built (no C compiler)")
    cache = KVCacheModel(capacity_pages=6) if model == "python" else kv_cache.native_kv_cache.KVPages(6)
    assert cache.reserve(3)
    cache.insert([1, 2, 3])       # a chain 1 -> 2 -> 3, locked by its request
    cache.reserved -= 3
    cache.unlock([1, 2, 3])       # released deepest first: 3 is the oldest, 1 the youngest
    assert cache.reserve(2)
    cache.insert([7, 8])
    cache.reserved -= 2
    assert cache.match([1, 2, 3, 4]) == 3
    assert cache.reserve(3)       # needs two evictions: 3, then 2 (never 1 before its children)
    assert cache.removed == [3, 2]
    assert cache.match([1, 2, 3]) == 1
    assert not cache.reserve(2)   # only 1 is unlocked; 7 and 8 are held
    cache.unlock([7, 8])
    removed, stored = cache.take_events()
    assert stored == [1, 2, 3, 7, 8] and removed == [3, 2]
    assert cache.stored == [] and cache.removed == []


def test_engine_step_time_follows_the_calibration():
    cal = Calibration(name="t", flops=cpu_tiny().flops, step_s=0.5, request_s=0.25, token_s=0.01, pair_s=0.001,
                      context_token_s=0.002, step_tokens=64, cache_tokens=10_000)
    timeline = Timeline()
    done = []

    class Sink:
        def finished(self, units):
            done.extend((unit.rid, timeline.now) for unit in units)

        def kv_events(self, engine, removed, stored):
            pass

    engine = Engine("w0", cal, 0.0, timeline, Sink(), SharedCompute(None))
    engine.submit(SimUnit("a", "a", [], 100, [11, 12, 13, 14, 15, 16], 0))  # 100 tokens: chunks of 64 + 36
    timeline.run()

    def chunk(s, p):
        return 0.01 * s + 0.001 * (s * p + s * (s + 1) / 2) + 0.002 * (p + s)

    expected = (0.5 + 0.25 + chunk(64, 0)) + (0.5 + chunk(36, 64))
    assert done == [("a", pytest.approx(expected))]
    # The same prompt again reuses the 6 full pages (96 tokens) and computes 4 tokens.
    engine.submit(SimUnit("b", "b", [], 100, [11, 12, 13, 14, 15, 16], 0))
    timeline.run()
    assert done[1][1] - done[0][1] == pytest.approx(0.5 + 0.25 + chunk(4, 96))


@pytest.mark.parametrize("overlap", ["off", "async", "sync"])
def test_overlap_processes_a_steps_results_after_the_next_step_is_admitted(overlap):
    """SGLang's overlap loop: with work waiting, the next batch is admitted before the finished one's pages enter
    the tree, so a request of the same prefix waiting then does not reuse them; its answer leaves at once
    (``async``) or after the next step (``sync``)."""
    cal = Calibration(name="t", flops=cpu_tiny().flops, step_s=1.0, request_s=0.0, token_s=0.0, pair_s=0.0,
                      step_tokens=48, cache_tokens=10_000, overlap=overlap)
    timeline = Timeline()
    done, stored_at = [], []

    class Sink:
        def finished(self, units):
            done.extend((unit.rid, unit.cached, timeline.now) for unit in units)

        def kv_events(self, engine, removed, stored):
            if stored:
                stored_at.append(timeline.now)

    engine = Engine("w0", cal, 0.0, timeline, Sink(), SharedCompute(None))
    prefix = [11, 12]
    engine.submit(SimUnit("leader", "a", [], 48, [*prefix, 13], 0))  # fills the step's 48-token budget
    engine.submit(SimUnit("follower", "b", [], 48, [*prefix, 14], 0))  # waits: the next step's
    timeline.run()
    follower_cached = 32 if overlap == "off" else 0
    leader_answer = {"off": 1.0, "async": 1.0, "sync": 2.0}[overlap]
    assert sorted(done) == [("follower", follower_cached, 2.0), ("leader", 0, leader_answer)]
    assert stored_at[0] == leader_answer
    # Nothing waiting: the results are processed at the end of the step, overlap or not.
    engine.submit(SimUnit("alone", "c", [], 48, [*prefix, 15], 0))
    timeline.run()
    assert done[-1] == ("alone", 32, 3.0)


@pytest.mark.parametrize("overlap", ["off", "async", "sync"])
def test_a_request_that_does_not_fit_waits_for_the_finished_steps_memory(overlap):
    """A pool with room for one request: the second, of the same prefix, does not fit while the first's
    memory is held. Under the overlap loop SGLang forms no batch then, processes the finished step's results
    (its pages enter the tree) and admits the second with the prefix cached; it must not run alone before
    that, recomputing the prefix (closed-mix replay: cache_aware's reuse 0.35 against 0.52 live)."""
    cal = Calibration(name="t", flops=cpu_tiny().flops, step_s=1.0, request_s=0.0, token_s=0.0, pair_s=0.0,
                      step_tokens=4096, cache_tokens=3072, page_size=16, overlap=overlap)
    timeline = Timeline()
    done = []

    class Sink:
        def finished(self, units):
            done.extend((unit.rid, unit.cached) for unit in units)

        def kv_events(self, engine, removed, stored):
            pass

    engine = Engine("w0", cal, 0.0, timeline, Sink(), SharedCompute(None))
    prefix = list(range(1, 180))  # 2,864 tokens
    engine.submit(SimUnit("first", "a", [], 2894, [*prefix, 500], 0))
    engine.submit(SimUnit("second", "a", [], 2894, [*prefix, 501], 0))
    timeline.run()
    assert done == [("first", 0), ("second", 2864)]
    assert engine.stats.overcommits == 0


def test_transfers_set_a_floor_under_each_step():
    cal = Calibration(name="t", flops=cpu_tiny().flops, step_s=0.0, request_s=0.0, token_s=1e-3, pair_s=0.0,
                      step_tokens=1000, cache_tokens=10_000, nvlink_transfer_s=0.2)
    timeline = Timeline()
    ends = []

    class Sink:
        def finished(self, units):
            ends.extend(timeline.now for _ in units)

        def kv_events(self, engine, removed, stored):
            pass

    engine = Engine("w0", cal, cal.transfer_s("nvlink"), timeline, Sink(), SharedCompute(None))
    engine.submit(SimUnit("small", "s", [], 50, [1, 2, 3], 0))    # 0.05 s of compute: the transfer wins
    timeline.run()
    engine.submit(SimUnit("large", "l", [], 500, [9] * 31, 0))    # 0.5 s of compute: hides the transfer
    timeline.run()
    assert ends == [pytest.approx(0.2), pytest.approx(0.7)]
    assert engine.stats.transfer_bound_steps == 1


def test_timeline_runs_in_time_order_and_same_time_in_order_given():
    t = Timeline()
    seen = []
    t.at(2.0, seen.append, "c")
    t.at(1.0, seen.append, "a")
    t.at(1.0, seen.append, "b")
    t.run()
    assert seen == ["a", "b", "c"] and t.now == 2.0


def test_calibrations_round_trip_through_json(tmp_path):
    for cal in (cpu_tiny(), h100_30b()):
        path = tmp_path / f"{cal.name}.json"
        path.write_text(json.dumps({"calibration": cal.to_json()}))
        assert load(str(path)) == cal
    with pytest.raises(ValueError):
        load("no-such-calibration")


def test_h100_preset_matches_the_physics_notes():
    cal = h100_30b()
    # ~5.5 GFLOPs per token of linear layers (attention projections + 8 of 128 experts, 48 layers)
    assert 5.0e9 < cal.flops.linear_flops_per_token < 6.0e9
    # NVLink all-gather of 47 layers at 2.9 ms (physics.md), PCIe at 22.04 ms per layer (measured on an H100)
    assert cal.nvlink_transfer_s == pytest.approx(47 * 2.9e-3)
    assert cal.pcie_transfer_s == pytest.approx(47 * 22.04e-3)
    # The GPU suite's fit: 0.467 ms per layer fixed (48 layers), 29% of peak per added token
    assert cal.step_s == pytest.approx(48 * 0.467e-3)
    assert cal.token_s == pytest.approx(cal.flops.linear_flops_per_token / (989e12 * 0.29))
    # T* (tokens whose compute hides the NVLink transfer) of the order physics.md gives (~10-40k)
    t_star = cal.hidden_theta("nvlink") / cal.flops.linear_flops_per_token
    assert 5_000 < t_star < 40_000


@pytest.mark.parametrize("name", ["chain_bytes", "chain_bytes_py"])
def test_chain_bytes_is_the_routers_hash_chain_across_partial_pages(name):
    """Both the function the stream calls (C pages where built) and its Python reference."""
    from sgl_moe.simulator import units

    chain_bytes = getattr(units, name)
    ids = array.array("I", range(7_000_000, 7_000_000 + 203))
    chain = ([], b"", None)
    for cut in (5, 16, 37, 40, 99, 150, 203):  # pieces that end mid-page and on a page boundary
        start = len(chain[0]) * 16 + len(chain[1]) // 4
        chain = chain_bytes(chain, ids[start:cut].tobytes(), 16)
    assert chain[0] == block_hashes(ids, 16)
    assert chain[1] == ids[len(chain[0]) * 16:].tobytes()
