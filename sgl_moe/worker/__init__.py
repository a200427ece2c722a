"""The worker side: what ``python -m sgl_moe.launch_server`` assembles around SGLang's own HTTP server.

- ``args``: the project's ``--moe-*`` flags (``MoeArgs``), validated once where they are built.
- ``argv``: a read-once view of SGLang's argv (the launcher never re-scans it by string).
- ``preflight``: checks needing no SGLang import (model path, ports, flag values) and the project's defaults.
- ``platform``: the CPU engine's required and default flags when no CUDA device is usable.
- ``runtime``: hands the patches their configuration (``patches.runtime_env.RuntimeConfig``).
- ``routes`` / ``info``: ``GET /sgl_moe/info`` (a ``wire.WorkerInfo``) and the tokenizer files.
- ``theta_calibration``: measures the saturation threshold Θ on the running worker (seed 000 App. B.4).

Light on import: nothing here imports torch; sglang and fastapi only inside the functions that need them.
"""
