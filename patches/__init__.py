"""sgl_moe.patches: named, idempotent transforms of SGLang's MoE execution, each behind a --moe-* flag.

- ``plugin``: the SGLang plugin entry point; registers hooks only for flags that are on.
- ``expert_streaming``: FusedMoE layers take experts from the AsyncEP ``WeightStreamer``
  (``--moe-weight-streaming host``).
- ``runtime_env`` / ``profile_handshake``: configuration and calibration files shared across SGLang's processes.

With every flag at its default SGLang's own code path runs untouched.
"""
