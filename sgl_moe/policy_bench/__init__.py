"""Side-by-side comparison of routing policies on real workers (issue 4 benchmark).

The same request stream — a seeded workload mix expanded into prefill-only ``/generate`` calls — goes
through each router in turn: this project's router with ``longest_block_match``, ``round_robin`` and
``least_flops``, and ``sglang-router`` with ``cache_aware`` and ``power_of_two``. Worker caches are flushed
and a fresh router is started before each policy, so each starts cold. ``python -m sgl_moe.policy_bench``.
"""
