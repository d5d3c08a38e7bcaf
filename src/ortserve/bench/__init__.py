"""Benchmarks: the same greedy workload on several inference backends, side by side.

    from ortserve.bench.runner import run_bench
    from ortserve.bench.report import write_report
    results = run_bench(model_dir, ["engine", "og"], Workload.quick())
    write_report(results, Path("bench-results"))

Each backend runs in its own subprocess (`python -m ortserve.bench.worker`) so that its
peak RSS, threads and imports (torch, llama.cpp) never leak into another backend's figures.
This package's modules import nothing heavy at import time: the Optimum worker runs them
in a separate venv that has neither ortserve's dependencies nor transformers 5.
"""
