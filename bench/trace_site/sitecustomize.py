"""On PYTHONPATH only when bench.probot_compare runs with BENCH_TRACE or BENCH_SQL: wraps
`vaultmail serve`'s store, worker and forge calls with bench.store_trace (timings only), and
counts its SQL statements with bench.sql_count; nothing else changes."""

import os

if os.environ.get("VAULTMAIL_BENCH_TRACE"):
    from bench.store_trace import install

    install(os.environ["VAULTMAIL_BENCH_TRACE"])

if os.environ.get("VAULTMAIL_BENCH_SQL"):
    from bench.sql_count import install as count_statements

    count_statements(os.environ["VAULTMAIL_BENCH_SQL"])
