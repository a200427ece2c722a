"""``Deadline``: the action runs at its deadline, never early, whether the deadline was moved later, earlier, dropped
and set again, and only the last one set runs; setting and dropping it arm no timer of the loop's while one is
pending."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import uvloop

from sgl_moe.router.front.deadline import Deadline


def _run(main):
    uvloop.run(main())


def test_the_last_deadline_set_runs_at_its_time_not_before():
    # Compared with the deadline itself, not with t0 + delay: uvloop's clock counts whole milliseconds, and
    # 68205.555 - 68205.405 is 0.1499999... in floating point (CI failed on it once with a timer that ran on time).
    async def main():
        loop = asyncio.get_running_loop()
        d = Deadline(loop)
        ran: list[tuple[str, float]] = []
        t0 = loop.time()
        d.set_in(0.05, lambda: ran.append(("first", loop.time())))
        d.set_in(0.15, lambda: ran.append(("moved later", loop.time())))  # the pending timer fires early and re-arms
        due = d.at
        await asyncio.sleep(0.3)
        assert [name for name, _ in ran] == ["moved later"]
        assert ran[0][1] >= due >= t0 + 0.15
        d.set_in(0.2, lambda: ran.append(("late", loop.time())))
        t1 = loop.time()
        d.set_in(0.05, lambda: ran.append(("moved earlier", loop.time())))  # before the pending timer: re-armed
        due = d.at
        await asyncio.sleep(0.12)
        assert [name for name, _ in ran[1:]] == ["moved earlier"]
        assert t1 + 0.05 <= due <= ran[1][1] < t1 + 0.12

    _run(main)


def test_a_cleared_deadline_runs_nothing_and_a_new_one_runs():
    async def main():
        loop = asyncio.get_running_loop()
        d = Deadline(loop)
        ran: list[str] = []
        d.set_in(0.05, lambda: ran.append("cleared"))
        d.clear()
        await asyncio.sleep(0.1)
        assert ran == [] and d.at is None
        d.set_in(0.02, lambda: ran.append("set again"))
        await asyncio.sleep(0.08)
        assert ran == ["set again"] and d.at is None

    _run(main)


def test_set_and_clear_reuse_the_pending_timer():
    async def main():
        loop = asyncio.get_running_loop()
        d = Deadline(loop)
        armed = []
        call_at = loop.call_at

        def counting_call_at(when, callback, *args):
            armed.append(when)
            return call_at(when, callback, *args)

        d.loop = SimpleNamespace(time=loop.time, call_at=counting_call_at)
        for _ in range(1000):  # a request each: its timeout set after the answer, dropped when the next one came
            d.set_in(30.0, lambda: None)
            d.clear()
        assert len(armed) == 1
        d.close()

    _run(main)


def test_close_cancels_the_loops_timer():
    async def main():
        loop = asyncio.get_running_loop()
        d = Deadline(loop)
        ran = []
        d.set_in(0.02, lambda: ran.append(1))
        d.close()
        await asyncio.sleep(0.06)
        assert ran == [] and d._timer is None

    _run(main)
