"""Where each prefix last went (``RouterConfig.prefix_homes``): the map, and the policy's use of it."""

import random
import shutil

import pytest

from sgl_moe.flops import FlopsModel
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.worker import Worker
from sgl_moe.router.placement import prefix_homes
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.job import Job
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.prefix_homes import PrefixHomes, PrefixHomesPy, sampled_positions
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.router.request.block_hash import PackedHashes
from sgl_moe.wire import SaturationInfo, WorkerInfo

PAGE = 16
FLOPS = FlopsModel(linear_flops_per_token=1000.0, attn_flops_per_pair=10.0, lm_head_flops_per_token=100.0,
                   num_layers=2, num_moe_layers=2)
INFO = WorkerInfo(model_name="test", page_size=PAGE, flops=FLOPS, saturation=SaturationInfo(1.0, "test", "fixed"))


def test_sampled_positions_are_powers_of_two_minus_one_and_the_last():
    assert sampled_positions(0) == ()
    assert sampled_positions(1) == (0,)
    assert sampled_positions(5) == (4, 3, 1, 0)
    assert sampled_positions(16) == (15, 7, 3, 1, 0)
    assert sampled_positions(17) == (16, 15, 7, 3, 1, 0)


def test_the_longest_recorded_prefix_names_the_home():
    homes = PrefixHomes()
    homes.record([1, 2, 3, 4], "a")          # records positions 3, 1, 0
    assert homes.home([1, 2, 3, 4, 5, 6]) == "a"
    homes.record([1, 2, 30, 40, 50], "b")    # shares blocks 0-1 with the first
    assert homes.home([1, 2, 3, 4]) == "a"   # its block 3 was last placed on a
    assert homes.home([1, 2, 9]) == "b"      # only blocks 0-1 known: last placed on b
    assert homes.home([7, 8]) is None
    assert homes.home([]) is None


def test_the_map_keeps_the_most_recently_recorded():
    homes = PrefixHomes(capacity=4)
    homes.record([1], "a")
    homes.record([2], "b")
    homes.record([3, 4], "c")
    homes.record([1], "d")  # re-recorded: now the newest
    homes.record([5], "e")  # over capacity: the oldest (2) goes
    assert len(homes) == 4
    assert homes.home([2]) is None
    assert homes.home([1]) == "d" and homes.home([5]) == "e"
    with pytest.raises(ValueError):
        PrefixHomes(capacity=0)


IMPLEMENTATIONS = [PrefixHomesPy] + ([prefix_homes.native_prefix_homes.PrefixHomes] if prefix_homes.NATIVE else [])


@pytest.mark.skipif(not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")),
                    reason="no C compiler on PATH: the Python map runs, as it should")
def test_the_c_map_was_built_where_a_compiler_is():
    assert prefix_homes.NATIVE and PrefixHomes is prefix_homes.native_prefix_homes.PrefixHomes, (
        "a C compiler is on PATH but the install did not build native_prefix_homes; rebuild with "
        "`bash tools/bootstrap.sh` and read its build output")


@pytest.mark.skipif(not prefix_homes.NATIVE, reason="the C map was not built (no C compiler at install)")
@pytest.mark.parametrize("capacity", [1, 7, 64, 5000])
def test_the_c_map_equals_the_python_reference_over_random_records(capacity):
    """The same homes, the same hashes kept in the same order, after each of 6,000 random records and lookups:
    prompts of 0-40 blocks sharing prefixes (so recorded hashes are recorded again and move to the newest), a small
    capacity that drops hashes within one record, negative and 64-bit hashes, hashes past 64 bits looked up; half
    the C map's records and lookups with the hashes packed (``PackedHashes``: the router's prompt keys)."""
    rng = random.Random(f"homes-{capacity}")
    roots = [[rng.randrange(-2**63, 2**63) for _ in range(40)] for _ in range(30)]
    native, python = prefix_homes.native_prefix_homes.PrefixHomes(capacity), PrefixHomesPy(capacity)
    for step in range(6000):
        root = rng.choice(roots)
        cut = rng.randint(0, len(root))
        keys = root[:cut] + [rng.randrange(-2**63, 2**63) for _ in range(rng.randint(0, 3))]
        packed = rng.random() < 0.5
        if rng.random() < 0.5:
            worker = f"w{rng.randrange(8)}"
            native.record(PackedHashes("q", keys) if packed else keys, worker), python.record(keys, worker)
        probe = keys if rng.random() < 0.7 else keys + [2**64 + 1]
        assert native.home(probe) == python.home(probe), step
        if packed and probe is keys:
            assert native.home(PackedHashes("q", keys)) == python.home(keys), step
        assert len(native) == len(python) <= capacity
        if step % 50 == 0:
            assert native.items() == python.items(), step
    assert native.items() == python.items() and len(python) == min(capacity, len(python)) > 0


@pytest.mark.parametrize("homes_type", IMPLEMENTATIONS)
def test_the_map_refuses_what_it_cannot_hold(homes_type):
    for bad in (0, -3):
        with pytest.raises(ValueError):
            homes_type(capacity=bad)
    homes = homes_type(capacity=4)
    with pytest.raises(TypeError):
        homes.record(5, "a")  # not a sequence
    assert homes.home([]) is None and homes.capacity == 4


@pytest.mark.skipif(not prefix_homes.NATIVE, reason="the C map was not built (no C compiler at install)")
def test_the_c_map_refuses_a_hash_past_64_bits_before_changing_anything():
    homes = prefix_homes.native_prefix_homes.PrefixHomes(capacity=4)
    with pytest.raises(OverflowError):
        homes.record([1, 2**63], "a")
    assert len(homes) == 0 and homes.home([1]) is None


def scheduler(homes: bool, theta: float = 3e7):
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=5)
    workers = [Worker(id=f"w{i}", url="", info=INFO, flops=FLOPS, theta=theta, theta_source="test",
                      slots={0: index.add_target()}) for i in range(3)]

    class Pool:
        installs = 0

        def __init__(self):
            self.workers = {w.id: w for w in workers}

        def routable(self, exclude=frozenset()):
            return [w for w in workers if w.id not in exclude]

    sched = Scheduler(RouterConfig(prefix_homes=homes), Pool(), index, ledger)
    return sched, index, ledger, workers


KEYS = list(range(100, 116))


def run_and_store(sched, index, ledger, keys=KEYS):
    """Place and finish a request holding ``keys``; its worker stores them. Returns its placement."""
    placed = sched.try_place(Job(rid="a", prompt_lens=[16 * PAGE + 3], keys=[keys]))
    sched.release(placed, ok=True)
    ledger.on_stored(placed.slot, index.store(placed.slot, keys))
    return placed


@pytest.mark.parametrize("scan_all", [False, True])
def test_a_prefix_evicted_everywhere_goes_back_to_its_home(scan_all):
    sched, index, ledger, workers = scheduler(homes=True)
    sched.scan_all = scan_all
    keys = KEYS
    first = run_and_store(sched, index, ledger)
    home = first.worker
    for _ in range(4):  # other prefixes: the in-turn order moves on from the home
        p = sched.try_place(Job(rid="x", prompt_lens=[20], keys=[[object().__hash__()]]))
        sched.release(p, ok=True)
    index.remove(first.slot, keys)  # evicted: now matched nowhere
    again = sched.try_place(Job(rid="b", prompt_lens=[16 * PAGE + 3], keys=[keys]))
    assert again.worker is home
    assert again.reason.startswith(f"no prefix match anywhere; its prefix last went to {home.id}")
    assert again.predicted_cached_tokens == 0


def test_without_homes_an_evicted_prefix_goes_by_load():
    sched, index, ledger, workers = scheduler(homes=False)
    keys = KEYS
    first = run_and_store(sched, index, ledger)
    index.remove(first.slot, keys)
    again = sched.try_place(Job(rid="b", prompt_lens=[16 * PAGE + 3], keys=[keys]))
    assert again.worker is not first.worker  # ties taken in turn: the next worker
    assert again.reason.startswith("no prefix match anywhere: least loaded")


def test_a_saturated_home_defers_in_the_first_pass_and_room_goes_to_its_own_jobs():
    sched, index, ledger, workers = scheduler(homes=True)
    sched.scan_all = True  # the load is set by hand below (the fast path's view follows reservations only)
    keys_a = KEYS
    a = run_and_store(sched, index, ledger)
    home = a.worker
    index.remove(a.slot, keys_a)
    home.inflight_flops = home.theta  # the home is saturated
    job = Job(rid="b", prompt_lens=[16 * PAGE + 3], keys=[keys_a])
    sched.policy.defer_spills = True  # the pump's first pass
    assert sched.try_place(job) is None
    assert sched.last_deferred and job.waiting_for == home.id
    sched.policy.defer_spills = False  # second pass: room elsewhere is not left idle
    placed = sched.try_place(job)
    assert placed is not None and placed.worker is not home
