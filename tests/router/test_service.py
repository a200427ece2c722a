"""The service's published hooks: other routes (``/v1/classify``) reuse placement and forwarding through them."""

import inspect

from sgl_moe.router.service import Router

HOOKS = ("run", "forward")


def test_published_hooks_are_public_documented_coroutines():
    for name in HOOKS:
        method = getattr(Router, name)
        assert inspect.iscoroutinefunction(method) and inspect.getdoc(method), name
