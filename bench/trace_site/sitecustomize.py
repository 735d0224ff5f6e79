"""On PYTHONPATH only when bench.probot_compare runs with BENCH_TRACE: wraps `vaultmail serve`'s
store, worker and forge calls with bench.store_trace (timings only; nothing else changes)."""

import os

if os.environ.get("VAULTMAIL_BENCH_TRACE"):
    from bench.store_trace import install

    install(os.environ["VAULTMAIL_BENCH_TRACE"])
