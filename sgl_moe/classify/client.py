"""Send a JSON-lines file of contract-A tasks to the router's ``POST /v1/classify`` in batches.

A producer reads the input, skips lines the journal already answered and queues batches; ``concurrency``
senders post them. Every answer goes to the journal as soon as its batch returns. How each HTTP outcome
is handled:

* 200: one result per task, in order; a result carrying ``error`` is journalled as a failure.
* 400: the batch holds an invalid task (the router checks everything before doing any work), so each task
  is re-sent alone: the bad line gets its own 400 and the others their results.
* 429 / 503: the router is busy or has no worker; wait ``Retry-After`` and send again, for at most
  ``busy_wait_s`` in total.
* a connection error: retried ``max_retries`` times with backoff (the router may be restarting).
* anything else (a timeout, 5xx, 404 ...): every line of the batch is journalled as failed (a later run
  retries it); a 5xx whose body still lists per-task results keeps each task's own error.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from sgl_moe.classify.journal import Journal, count_input, iter_input, parse_task, read_journal
from sgl_moe.classify.progress import Progress

BUSY = (429, 503)
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ClassifyConfig:
    router: str = "http://127.0.0.1:30080"
    """Base URL of the router (python -m sgl_moe.router)."""
    batch_size: int = 32
    """Tasks per /v1/classify call."""
    concurrency: int = 4
    """Batches in flight at once."""
    out: str | None = None
    """Results file (JSON lines, appended to); default: the input file with suffix .results.jsonl."""
    retry_failed: bool = True
    """Re-send lines whose earlier result was an error (--no-retry-failed skips them)."""
    model: str | None = None
    """Model name sent with every call (the router checks it against its workers' model)."""
    timeout_s: float = 900.0
    """Longest one call may take; a batch that times out is journalled as failed."""
    busy_wait_s: float = 900.0
    """Longest a batch keeps waiting on 429/503 (honouring Retry-After) before it is journalled as failed."""
    max_retries: int = 5
    """Retries of a batch whose connection failed (backoff 0.5 s doubling up to 30 s)."""
    progress_interval_s: float = 5.0
    """Seconds between progress lines when stderr is not a terminal."""

    def validate(self) -> None:
        if not self.router.startswith(("http://", "https://")) or len(self.router.split("://", 1)[1]) == 0:
            raise ValueError(f"--router must be an http:// or https:// URL, got {self.router!r}")
        for name in ("batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_retries < 0:
            raise ValueError(f"--max-retries must be >= 0, got {self.max_retries}")
        for name in ("timeout_s", "progress_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.busy_wait_s < 0:
            raise ValueError(f"--busy-wait-s must be >= 0, got {self.busy_wait_s}")


Item = tuple[int, dict]
"""One task to send: (input line number, task object)."""


@dataclass
class Reply:
    """The outcome of one call after retries: ``status`` 0 means no HTTP answer (``why`` says what)."""

    status: int
    payload: Any = None
    why: str = ""


def retry_after_s(value: str | None, default: float = 1.0) -> float:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), within [0, 60]."""
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return default
    return min(max(seconds, 0.0), 60.0)


def _message(reply: Reply) -> str:
    if reply.status == 0:
        return reply.why
    err = reply.payload.get("error") if isinstance(reply.payload, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return f"HTTP {reply.status}: {err['message']}"
    return f"HTTP {reply.status}: {reply.why or str(reply.payload)[:300]}"


class ClassifyRun:
    """One pass over the input file; ``run`` returns when every line is answered or ``stop`` is set."""

    def __init__(self, cfg: ClassifyConfig, input_path: Path, out_path: Path, progress_stream: Any,
                 tty: bool) -> None:
        self.cfg = cfg
        self.input_path = input_path
        self.out_path = out_path
        self.progress = Progress(count_input(input_path), progress_stream, tty=tty,
                                 interval_s=cfg.progress_interval_s)
        self.skipped_failed = 0
        """Lines skipped although their earlier answer was an error (``--no-retry-failed``)."""
        self.stale = 0
        """Journal entries whose id no longer matches the input line (the input changed): re-sent."""
        self.interrupted = False
        self._journal: Journal | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def all_ok(self) -> bool:
        p = self.progress
        return not self.interrupted and p.failed == 0 and self.skipped_failed == 0 and p.done == p.total

    async def run(self, stop: asyncio.Event) -> None:
        answered = read_journal(self.out_path)
        self._journal = Journal(self.out_path)
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as self._session:
                work = asyncio.create_task(self._work(answered))
                stopper = asyncio.create_task(stop.wait())
                ticker = asyncio.create_task(self._tick())
                await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
                for t in (work, stopper, ticker):
                    t.cancel()
                self.interrupted = not work.done() or work.cancelled()
                await asyncio.gather(work, stopper, ticker, return_exceptions=True)
                if work.done() and not work.cancelled() and work.exception() is not None:
                    raise work.exception()  # type: ignore[misc]
        finally:
            self._journal.close()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(min(self.cfg.progress_interval_s, 0.5))
            self.progress.tick()

    async def _work(self, answered: dict) -> None:
        queue: asyncio.Queue[list[Item] | None] = asyncio.Queue(maxsize=self.cfg.concurrency)
        senders = [asyncio.create_task(self._sender(queue)) for _ in range(self.cfg.concurrency)]
        try:
            batch: list[Item] = []
            for line, raw in iter_input(self.input_path):
                task, why = parse_task(raw)
                prev = answered.get(line)
                if prev is not None and task is not None and prev.id != task.get("id"):
                    self.stale += 1  # the input changed under the journal: this line's answer is not ours
                elif prev is not None and (prev.ok or not self.cfg.retry_failed):
                    self.skipped_failed += not prev.ok
                    self.progress.add(skipped=1)
                    continue
                if task is None:
                    self._fail(line, None, why, None)
                    continue
                batch.append((line, task))
                if len(batch) == self.cfg.batch_size:
                    await queue.put(batch)
                    batch = []
            if batch:
                await queue.put(batch)
            for _ in senders:
                await queue.put(None)
            await asyncio.gather(*senders)
        finally:
            for s in senders:
                s.cancel()

    async def _sender(self, queue: asyncio.Queue) -> None:
        while (batch := await queue.get()) is not None:
            await self._send_batch(batch)

    def _ok(self, line: int, tid: Any, result: dict) -> None:
        self._journal.success(line, tid, result)  # type: ignore[union-attr]
        self.progress.add(ok=1)

    def _fail(self, line: int, tid: Any, message: str, code: int | None) -> None:
        self._journal.failure(line, tid, message, code)  # type: ignore[union-attr]
        self.progress.add(failed=1)

    async def _send_batch(self, batch: list[Item]) -> None:
        body: dict[str, Any] = {"inputs": [task for _, task in batch]}
        if self.cfg.model is not None:
            body["model"] = self.cfg.model
        reply = await self._post(body)
        if reply.status == 400 and len(batch) > 1:
            # Nothing was run; find the bad line(s) by sending each task alone.
            await asyncio.gather(*(self._send_one(item) for item in batch))
            return
        self._journal_reply(batch, reply)

    async def _send_one(self, item: Item) -> None:
        body = dict(item[1])
        if self.cfg.model is not None:
            body["model"] = self.cfg.model
        self._journal_reply([item], await self._post(body))

    def _journal_reply(self, batch: list[Item], reply: Reply) -> None:
        results = reply.payload.get("results") if isinstance(reply.payload, dict) else None
        if isinstance(results, list) and len(results) == len(batch):  # a failed call may still list each task's error
            for (line, task), result in zip(batch, results):
                if not isinstance(result, dict):
                    self._fail(line, task.get("id"), f"malformed result: {str(result)[:200]}", reply.status)
                elif "error" in result:
                    err = result["error"] if isinstance(result["error"], dict) else {"message": str(result["error"])}
                    self._fail(line, task.get("id"), str(err.get("message")), err.get("code", reply.status))
                else:
                    self._ok(line, task.get("id"), result)
            return
        why = _message(reply) if reply.status != 200 else f"malformed answer: {str(reply.payload)[:300]}"
        for line, task in batch:
            self._fail(line, task.get("id"), why, reply.status or None)

    async def _post(self, body: dict) -> Reply:
        """One call, retried while the router is busy or unreachable (see the module docstring)."""
        url = f"{self.cfg.router.rstrip('/')}/v1/classify"
        data = orjson.dumps(body)
        busy_deadline = time.monotonic() + self.cfg.busy_wait_s
        attempts = 0
        while True:
            try:
                async with self._session.post(url, data=data,  # type: ignore[union-attr]
                                              headers={"content-type": "application/json"}) as resp:
                    raw = await resp.read()
                    try:
                        payload = orjson.loads(raw) if raw else None
                    except orjson.JSONDecodeError:
                        payload = None
                    reply = Reply(resp.status, payload, raw[:300].decode(errors="replace"))
                    wait = retry_after_s(resp.headers.get("Retry-After"))
            except TimeoutError:
                return Reply(0, why=f"no answer within {self.cfg.timeout_s:g} s")
            except aiohttp.ClientError as exc:
                attempts += 1
                if attempts > self.cfg.max_retries:
                    return Reply(0, why=f"connection failed: {exc}")
                await asyncio.sleep(min(0.5 * 2 ** (attempts - 1), MAX_BACKOFF_S))
                continue
            if reply.status not in BUSY or time.monotonic() + wait > busy_deadline:
                return reply
            await asyncio.sleep(wait)
