"""Requests are placed in the order their bodies arrived, though large ones are parsed in threads."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from doubles.stand_in import tokenizer_dir

from sgl_moe.router.front.arrival_order import ArrivalOrder
from sgl_moe.router.front.service import ROUTER

from .test_hardening import Setup


def test_turns_follow_tickets_whatever_order_they_are_ready_in():
    async def run() -> list[int]:
        order, placed = ArrivalOrder(), []

        async def request(ticket: int, parse_s: float) -> None:
            try:
                await asyncio.sleep(parse_s)
                await order.wait_turn(ticket)
                placed.append(ticket)
            finally:
                order.leave(ticket)

        tickets = [order.ticket() for _ in range(4)]
        await asyncio.gather(*(request(t, s) for t, s in zip(tickets, (0.05, 0.0, 0.02, 0.01))))
        return placed

    assert asyncio.run(run()) == [0, 1, 2, 3]


def test_a_request_that_ends_early_or_is_cancelled_passes_the_turn_on():
    async def run() -> list[int]:
        order, placed = ArrivalOrder(), []
        first, second, third = order.ticket(), order.ticket(), order.ticket()

        async def waits(ticket: int) -> None:
            try:
                await order.wait_turn(ticket)
                placed.append(ticket)
            finally:
                order.leave(ticket)

        slow = asyncio.create_task(waits(third))
        cancelled = asyncio.create_task(waits(second))
        await asyncio.sleep(0.01)
        assert order.waiting == 2
        cancelled.cancel()  # the client of the second request went away while it waited
        order.leave(first)  # the first ended early (a 400)
        order.leave(first)  # idempotent
        await slow
        assert order.waiting == 0
        return placed

    assert asyncio.run(run()) == [2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    s = Setup(tokenizer_dir(tmp_path_factory.mktemp("tok"), template=True))
    yield s
    s.close()


def test_a_small_request_does_not_overtake_a_large_one_parsed_in_a_thread(setup, monkeypatch):
    """The large body's parse is made slow (0.5 s, in its thread): the small one, parsed at once on the event
    loop, must still wait for it to be placed."""
    import sgl_moe.router.front.intake as intake

    parse = intake.parse_request

    def slow_parse(endpoint, raw, **kw):
        if len(raw) > 1000:
            time.sleep(0.5)
        return parse(endpoint, raw, **kw)

    monkeypatch.setattr(intake, "parse_request", slow_parse)
    client = setup.client("ordered", parse_inline_bytes=1000)
    router = client.server.app[ROUTER]
    placed: list[str] = []
    acquire = router.scheduler.acquire

    async def spy(job):
        placed.append(job.rid)
        return await acquire(job)

    router.scheduler.acquire = spy
    large = {"text": "word " * 400, "sampling_params": {"max_new_tokens": 0}}
    small = {"text": "hi", "sampling_params": {"max_new_tokens": 0}}

    async def go() -> list[int]:
        issued = router.order._issued
        first = asyncio.ensure_future(client.post("/generate", json=large, headers={"x-request-id": "large"}))
        deadline = time.monotonic() + 10
        while router.order._issued == issued:  # the large body has arrived and is being parsed in a thread
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        second = await client.post("/generate", json=small, headers={"x-request-id": "small"})
        return [(await first).status, second.status]

    try:
        assert setup.loop.run_until_complete(go()) == [200, 200]
    finally:
        router.scheduler.acquire = acquire
    assert placed == ["large", "small"]
