"""One request from the router to a worker: the call, what its failures mean, and aborting it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from sgl_moe.router.errors import WorkerFailure

ABORT_PATH = "/abort_request"
"""SGLang's route that aborts a request by ``rid``."""


def failure(exc: BaseException) -> WorkerFailure:
    """The ``WorkerFailure`` an exception of the worker call stands for."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return WorkerFailure(text, transport=True, connect=True)
    if isinstance(exc, TimeoutError):
        return WorkerFailure(text, transport=False, timeout=True)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        return WorkerFailure(text, transport=True)  # the connection broke after the request went out
    return WorkerFailure(text, transport=False)


@asynccontextmanager
async def upstream(session: aiohttp.ClientSession, url: str, body: bytes,
                   headers: dict[str, str]) -> AsyncIterator[aiohttp.ClientResponse]:
    """``POST url`` with ``body``; the response, open until the block ends. Failures raise ``WorkerFailure``."""
    try:
        resp = await session.post(url, data=body, headers=headers)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise failure(exc) from None
    async with resp:
        yield resp


async def abort_on_worker(session: aiohttp.ClientSession, base_url: str, rid: str, timeout_s: float) -> str | None:
    """Ask the worker to abort request ``rid``, waiting at most ``timeout_s``. None: the worker accepted, or its
    process is gone (a refused connection: the request went with it). Otherwise why the abort did not get through
    (``repr`` of the error, never empty): the worker may still be running the request."""
    try:
        async with session.post(base_url + ABORT_PATH, json={"rid": rid},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            return None if resp.status == 200 else f"answered {resp.status}"
    except aiohttp.ClientConnectorError:
        return None
    except (TimeoutError, aiohttp.ClientError) as exc:
        return repr(exc)
