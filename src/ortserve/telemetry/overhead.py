"""Measure what telemetry costs per request: `python -m ortserve.telemetry.overhead [N]`.

Records N request spans (each with one correlated log line and full metrics) into a
temporary directory, and prints the time spent on the calling thread (the request path)
per request, the time to flush everything to disk, and bytes on disk per request.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from ortserve.telemetry.base import TelemetryConfig
from ortserve.telemetry.files import list_files
from ortserve.types import EngineStats


def measure(n: int, directory: Path) -> dict[str, float]:
    from ortserve.telemetry.otel import FileTelemetry

    tel = FileTelemetry(TelemetryConfig(directory=directory, metric_interval_s=1.0))
    logger = logging.getLogger("ortserve.overhead")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tel.install_logging(logger)
    tel.observe_engine(lambda: EngineStats(1, 0, 50.0, n, n * 20), model="m")
    t0 = time.perf_counter()
    for i in range(n):
        with tel.request_span("/v1/chat/completions", model="smollm2-135m", provider="local",
                              execution_provider="cpu") as span:
            logger.info("request %d routed to local", i)
            span.finish(input_tokens=40, output_tokens=20, ttft=0.03, tpot=0.008, finish_reason="stop")
    request_path = time.perf_counter() - t0
    t1 = time.perf_counter()
    tel.shutdown()
    flush = time.perf_counter() - t1
    size = sum(f.size for f in list_files(directory))
    return {"requests": n, "us_per_request": 1e6 * request_path / n, "flush_s": flush,
            "bytes_per_request": size / n}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(n, Path(tmp))
    print(f"{r['requests']} requests: {r['us_per_request']:.0f} us per request on the request path, "
          f"{r['flush_s']:.2f} s to flush, {r['bytes_per_request']:.0f} bytes on disk per request")


if __name__ == "__main__":
    main()
