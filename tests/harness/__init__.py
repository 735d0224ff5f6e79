"""A fault-injection harness (issues 27 and 28): a seeded schedule of faults over a mixed
workload (`schedule`), a runner that plays it against the local forge and the app's processes
and checks what every accepted mail left behind (`runner`). tests/test_fault_harness.py runs one
seed per engine; `python -m bench.soak` runs random seeds by hand."""
