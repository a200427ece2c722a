"""Where a job runs: the committed and pending block tables, load and admission (Θ), the policy, prefix holds,
the FIFO queue, the quarantine lane and the suspects it tries."""
