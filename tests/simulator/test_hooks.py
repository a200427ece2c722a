"""The simulator drives the router only through hooks the router publishes for it, never through privates.

``HOOKS`` lists what ``sgl_moe.simulator`` (``router_frontend``, ``memo``) calls, overrides or reads on router
objects; each exists and says in its docstring that it is a hook. The AST scan then checks that no simulator
module reads, writes or overrides a name a router class keeps private (a leading underscore), or stashes
data on router objects through ``__dict__``/``getattr``/``setattr``.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import sgl_moe.router as router_pkg
import sgl_moe.simulator as simulator_pkg
from sgl_moe.router.config import RouterConfig
from sgl_moe.router.membership.event_sink import KvEventSink
from sgl_moe.router.membership.worker_pool import WorkerPool
from sgl_moe.router.placement.block_index import BlockIndex
from sgl_moe.router.placement.pending import PendingLedger
from sgl_moe.router.placement.scheduler import Scheduler

HOOKS: dict[type, tuple[str, ...]] = {
    WorkerPool: ("without_http", "admit"),
    KvEventSink: ("on_batch",),
    Scheduler: ("try_place", "pump", "release", "reserved", "view", "uniform_view", "any_admissible"),
    BlockIndex: ("holders",),
}
"""Methods and properties documented as hooks for the simulator."""
SCHEDULER_ATTRIBUTES = ("queue", "ahead", "stats", "clock", "scan_all", "policy", "fast_path", "last_deferred")
"""Scheduler attributes the simulator reads or sets, named in the class docstring's hook list."""
INDEX_MUTATORS = ("add_target", "remove_target", "store", "remove", "clear_committed", "promise", "retire",
                  "match_groups")
"""BlockIndex methods the simulator's LoggedBlockIndex overrides, named in the class docstring."""


def _modules(pkg) -> list[Path]:
    return sorted(Path(pkg.__path__[0]).rglob("*.py"))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _router_private_names() -> set[str]:
    """Every private method, attribute or field a router class defines."""
    names: set[str] = set()
    for path in _modules(router_pkg):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = node.name
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    name = node.target.id
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                    name = node.attr
                else:
                    continue
                if _is_private(name):
                    names.add(name)
    return names


@pytest.mark.parametrize("cls", list(HOOKS), ids=lambda c: c.__name__)
def test_every_hook_exists_and_says_so(cls):
    for name in HOOKS[cls]:
        member = inspect.getattr_static(cls, name)
        if inspect.isgetsetdescriptor(member):  # a property of a class compiled as an extension type (a .pxd)
            func = member
        else:
            func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            assert callable(func), f"{cls.__name__}.{name}"
        assert "hook" in (func.__doc__ or "").lower(), f"{cls.__name__}.{name}: docstring does not call it a hook"


def test_scheduler_attributes_and_index_mutators_are_published():
    index = BlockIndex()
    ledger = PendingLedger(index, ttl_s=1.0)
    pool = WorkerPool.without_http(RouterConfig(), index, ledger, on_change=lambda: None)
    sched = Scheduler(RouterConfig(), pool, index, ledger)
    for name in SCHEDULER_ATTRIBUTES:
        assert hasattr(sched, name) and f"``{name}``" in Scheduler.__doc__, name
    for name in INDEX_MUTATORS:
        assert callable(getattr(BlockIndex, name)) and f"``{name}``" in BlockIndex.__doc__, name
    assert "hook" in Scheduler.__doc__.lower() and "hook" in BlockIndex.__doc__.lower()


def test_the_scan_knows_the_privates_the_simulator_used_to_touch():
    private = _router_private_names()
    for name in ("_reference", "_adding", "_slot_owner", "_next_id", "_reserve", "_view", "_tables",
                 "_hold_for_prefix", "_note_decision"):
        assert name in private, name


class _Scan(ast.NodeVisitor):
    """Router privates a simulator module touches. ``self._x`` inside a simulator class of its own is that
    class's own attribute; inside a subclass of a router class it is the router object's."""

    def __init__(self, module: str, tree: ast.Module, private: set[str]) -> None:
        self.module, self.private = module, private
        self.router_names = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                             and (node.module or "").startswith("sgl_moe.router") for a in node.names}
        self.own_self = False
        self.offenders: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        router_subclass = any(isinstance(b, ast.Name) and b.id in self.router_names for b in node.bases)
        if router_subclass:
            self.offenders += [f"{self.module}:{item.lineno}: {node.name} overrides {item.name}" for item in node.body
                               if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                               and item.name in self.private]
        outer, self.own_self = self.own_self, not router_subclass
        self.generic_visit(node)
        self.own_self = outer

    def visit_Attribute(self, node: ast.Attribute) -> None:
        own = self.own_self and isinstance(node.value, ast.Name) and node.value.id == "self"
        if node.attr == "__dict__" or (node.attr in self.private and not own):
            self.offenders.append(f"{self.module}:{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                and _is_private(str(node.args[1].value))):
            self.offenders.append(f"{self.module}:{node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)


def test_simulator_touches_no_router_private():
    private = _router_private_names()
    offenders = []
    for path in _modules(simulator_pkg):
        tree = ast.parse(path.read_text())
        scan = _Scan(path.name, tree, private)
        scan.visit(tree)
        offenders += scan.offenders
    assert not offenders, offenders


def test_the_scan_catches_what_the_simulator_used_to_do():
    old = """
from sgl_moe.router.placement.scheduler import Scheduler
from sgl_moe.router.membership.worker_pool import WorkerPool

class SimPool(WorkerPool):
    def __init__(self, workers):
        self._slot_owner = {}

class MemoScheduler(Scheduler):
    def _reserve(self, job, c, reason, t0):
        return super()._reserve(job, c, reason, t0)

class Frontend:
    def submit(self, job):
        self._units = {}
        job.__dict__["_certificate"] = None
        return self.scheduler._hold_for_prefix(job, None)
"""
    tree = ast.parse(old)
    scan = _Scan("old.py", tree, _router_private_names())
    scan.visit(tree)
    found = " ".join(scan.offenders)
    for needle in ("self._slot_owner", "overrides _reserve", "super()._reserve", "__dict__",
                   "scheduler._hold_for_prefix"):
        assert needle in found, (needle, scan.offenders)
    assert "_units" not in found  # the frontend's own attribute
