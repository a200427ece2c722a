"""Load testing the router with locust: the prefill-only workloads of seed 000 Table 2, replayed headless.

    python -m sgl_moe.loadtest --host URL --users 8 --run-time 60s --csv out/mix

- ``runner`` (``python -m sgl_moe.loadtest``): ``LoadTestConfig``, runs locust on ``locustfile.py``,
  summarises its CSVs and gates the exit status on the failure ratio.
- ``locustfile``: the locust user classes, one per workload and ``MixUser``; loaded by locust only (it
  imports gevent and locust), never imported by the package.
- ``traffic``: what the users send and how each answer is judged (pure: no locust, no gevent).

Nothing is re-exported here: the locust processes import ``traffic`` through this package and need
nothing else. See loadtest/README.md.
"""
