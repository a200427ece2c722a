"""Run a function on N local ranks joined by a process group (spawned processes; gloo on CPU, NCCL with one
GPU per rank); results come back by queue. Used by the gather/hybrid self-check and its tests."""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, backend: str, fn, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        import torch

        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        results.put((rank, fn(rank, world, *args), None))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world: int, *args, backend: str = "gloo", timeout_s: float = 120.0) -> list:
    """``fn(rank, world, *args)`` on every rank; returns the results by rank, raises a rank's traceback."""
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, backend, fn, args, results)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, object] = {}
    errors = []
    for _ in range(world):
        rank, value, err = results.get()
        if err:
            errors.append(f"rank {rank}:\n{err}")
        out[rank] = value
    for p in procs:
        p.join(timeout=timeout_s)
        if p.is_alive():
            p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [out[r] for r in range(world)]
