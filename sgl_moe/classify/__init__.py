"""The bulk classification client: a JSON-lines file of contract-A tasks through the router's ``/v1/classify``.

    python -m sgl_moe.classify tasks.jsonl --router URL

- ``cli``: the command line (flags from ``ClassifyConfig``, usage checks, exit status).
- ``client``: ``ClassifyConfig`` and ``ClassifyRun``: batching, concurrency, retries, 400 splitting.
- ``journal``: the input file and the append-only results file that makes a rerun resume.
- ``progress``: the progress line (done/total, rate, ETA, failures).

Nothing is re-exported here: ``client`` pulls in aiohttp, which a reader of ``journal`` does not need.
No module of the client imports torch or sglang (a test checks it).
"""
