"""sgl_moe.router: prefix-aware, FLOPs-aware front router for SGLang workers.

Imports neither torch nor sglang (tests/router/test_imports.py enforces it): it runs in a light
process and talks to workers only over HTTP and ZMQ.
"""

from sgl_moe.router import compiled_modules

compiled_modules.install()  # before any module of the router is imported: a stale compiled one runs its source
