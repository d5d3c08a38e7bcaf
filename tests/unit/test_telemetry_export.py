"""The file exporters: OTLP/JSON spans, metrics and logs, privacy, failure handling."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from ortserve.config import load_settings
from ortserve.errors import Overloaded
from ortserve.telemetry import Telemetry, TelemetryConfig
from ortserve.telemetry import names as n
from ortserve.telemetry.decode import attrs_of
from ortserve.telemetry.otel import FileTelemetry
from ortserve.types import EngineStats


def lines(directory: Path, signal: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(directory.glob(f"{signal}-*.jsonl")):
        for raw in path.read_text(encoding="utf-8").splitlines():
            out.append(json.loads(raw))
    return out


def spans(directory: Path) -> list[dict[str, Any]]:
    return [sp for req in lines(directory, "traces") for rs in req["resourceSpans"]
            for ss in rs["scopeSpans"] for sp in ss["spans"]]


def log_records(directory: Path) -> list[dict[str, Any]]:
    return [lr for req in lines(directory, "logs") for rl in req["resourceLogs"]
            for sl in rl["scopeLogs"] for lr in sl["logRecords"]]


def metrics(directory: Path) -> dict[str, dict[str, Any]]:
    """Last exported state of each metric by name."""
    out: dict[str, dict[str, Any]] = {}
    for req in lines(directory, "metrics"):
        for rm in req["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    out[m["name"]] = m
    return out


@pytest.fixture
def tel(tmp_path: Path):
    t = FileTelemetry(TelemetryConfig(directory=tmp_path / "tel", metric_interval_s=3600))
    yield t
    t.shutdown()


def test_span_attributes_are_written_as_otlp_json(tel: FileTelemetry) -> None:
    with tel.request_span("/v1/chat/completions", model="smollm2-135m", provider="local",
                          execution_provider="cpu", request_id="req-1") as span:
        span.finish(input_tokens=12, output_tokens=30, ttft=0.05, tpot=0.012, finish_reason="stop",
                    status=200)
        trace_id = span.trace_id
    tel.shutdown()

    (sp,) = spans(tel.directory)
    a = attrs_of(sp["attributes"])
    assert sp["traceId"] == trace_id and len(sp["traceId"]) == 32 and len(sp["spanId"]) == 16
    assert sp["kind"] == 2  # SPAN_KIND_SERVER
    assert sp["name"] == "/v1/chat/completions"
    assert int(sp["endTimeUnixNano"]) >= int(sp["startTimeUnixNano"]) > 0
    assert a[n.ROUTE] == "/v1/chat/completions"
    assert a[n.MODEL] == "smollm2-135m"
    assert a[n.PROVIDER] == "local"
    assert a[n.EXECUTION_PROVIDER] == "cpu"
    assert a[n.REQUEST_ID] == "req-1"
    assert a[n.INPUT_TOKENS] == 12 and a[n.OUTPUT_TOKENS] == 30
    assert a[n.TTFT] == pytest.approx(0.05) and a[n.TPOT] == pytest.approx(0.012)
    assert a[n.FINISH_REASONS] == ["stop"]
    assert a[n.STATUS_CODE] == 200 and a[n.STATUS] == "ok"
    assert sp["status"]["code"] == 0  # unset: success
    # OTLP/JSON rules: 64-bit ints as strings, resource identifies the service
    assert sp["attributes"][0]["key"] == n.ROUTE
    res = attrs_of(lines(tel.directory, "traces")[0]["resourceSpans"][0]["resource"]["attributes"])
    assert res["service.name"] == "ortserve" and res["process.pid"] > 0


def test_errors_and_cancellations_are_recorded(tel: FileTelemetry) -> None:
    with pytest.raises(Overloaded), tel.request_span("/v1/completions", model="m"):
        raise Overloaded("queue full")
    with pytest.raises(RuntimeError), tel.request_span("/v1/completions", model="m"):
        raise RuntimeError("engine died")
    with pytest.raises(asyncio.CancelledError), tel.request_span("/v1/completions", model="m") as sp:  # noqa: PT012
        sp.set(provider="local")
        raise asyncio.CancelledError
    tel.shutdown()

    by_status = {attrs_of(s["attributes"])[n.STATUS_CODE]: s for s in spans(tel.directory)}
    assert set(by_status) == {429, 500, 499}
    a429 = attrs_of(by_status[429]["attributes"])
    assert a429[n.STATUS] == "error" and a429[n.ERROR_TYPE] == "Overloaded"
    assert by_status[500]["status"]["code"] == 2  # ERROR
    assert any(e["name"] == "exception" for e in by_status[500]["events"])
    a499 = attrs_of(by_status[499]["attributes"])
    assert a499[n.FINISH_REASONS] == ["abort"] and a499[n.PROVIDER] == "local"


def test_metrics_are_written(tel: FileTelemetry) -> None:
    stats = EngineStats(running=3, waiting=5, tokens_per_second=42.5, total_requests=7,
                        total_output_tokens=900)
    tel.observe_engine(lambda: stats, model="m")
    for i in range(4):
        with tel.request_span("/v1/chat/completions", model="m", provider="local") as span:
            span.finish(input_tokens=10, output_tokens=i + 1, ttft=0.01 * (i + 1), tpot=0.002,
                        finish_reason="stop", status=200)
    tel.shutdown()

    m = metrics(tel.directory)
    (req,) = m[n.M_REQUESTS]["sum"]["dataPoints"]
    assert int(req["asInt"]) == 4 and m[n.M_REQUESTS]["sum"]["isMonotonic"] is True
    (ttft,) = m[n.M_TTFT]["histogram"]["dataPoints"]
    assert int(ttft["count"]) == 4 and ttft["sum"] == pytest.approx(0.1)
    assert ttft["explicitBounds"] == list(n.TTFT_BOUNDS)
    assert int(m[n.M_DURATION]["histogram"]["dataPoints"][0]["count"]) == 4
    tokens = {attrs_of(p["attributes"])[n.TOKEN_TYPE]: int(p["asInt"])
              for p in m[n.M_TOKENS]["sum"]["dataPoints"]}
    assert tokens == {"input": 40, "output": 1 + 2 + 3 + 4}
    assert m[n.M_WAITING]["gauge"]["dataPoints"][0]["asInt"] == "5"
    assert m[n.M_RUNNING]["gauge"]["dataPoints"][0]["asInt"] == "3"
    assert m[n.M_TPS]["gauge"]["dataPoints"][0]["asDouble"] == 42.5
    assert m[n.M_ENGINE_OUTPUT]["sum"]["dataPoints"][0]["asInt"] == "900"
    assert n.M_KV not in m  # EngineStats reports no KV usage, so nothing is invented


def test_logs_carry_trace_ids(tel: FileTelemetry) -> None:
    logger = logging.getLogger("ortserve.test_telemetry_logs")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tel.install_logging(logger)
    with tel.request_span("/v1/chat/completions", model="m") as span:
        logger.info("routing to %s", "local", extra={"queue_depth": 2})
        inside = span.trace_id
    logger.warning("outside any request")
    tel.shutdown()
    assert tel.log_handler not in logger.handlers  # shutdown detaches it

    recs = {lr["body"]["stringValue"]: lr for lr in log_records(tel.directory)}
    (sp,) = spans(tel.directory)
    routed = recs["routing to local"]
    assert routed["traceId"] == inside == sp["traceId"]
    assert routed["spanId"] == sp["spanId"]
    assert routed["severityNumber"] == 9 and routed["severityText"] == "INFO"
    assert attrs_of(routed["attributes"])["queue_depth"] == 2
    outside = recs["outside any request"]
    assert "traceId" not in outside and outside["severityText"] == "WARN"
    (access,) = [lr for lr in recs.values() if lr.get("eventName") == "ortserve.request"]
    assert access["body"]["stringValue"].startswith("/v1/chat/completions 200 ")
    assert access["traceId"] == sp["traceId"] and access["spanId"] == sp["spanId"]
    assert attrs_of(access["attributes"])[n.MODEL] == "m"


def test_trace_context_filter_decorates_stdlib_records(tel: FileTelemetry) -> None:
    logger = logging.getLogger("ortserve.test_telemetry_filter")
    logger.propagate = False
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    logger.addHandler(keep)
    tel.install_logging(logger)
    with tel.request_span("/x") as span:
        logger.warning("hi")
        logging.getLogger("ortserve.test_telemetry_filter.child").warning("from a child logger")
    logger.warning("after")
    assert [r.trace_id for r in seen] == [span.trace_id, span.trace_id, ""]  # type: ignore[attr-defined]
    tel.shutdown()
    assert not keep.filters  # shutdown takes the filter off again


def test_no_prompt_text_by_default(tmp_path: Path) -> None:
    for content in (False, True):
        directory = tmp_path / str(content)
        tel = FileTelemetry(TelemetryConfig(directory=directory, content=content, metric_interval_s=3600))
        with tel.request_span("/v1/chat/completions", model="m") as span:
            span.record_content(prompt=[{"role": "user", "content": "SECRET-PROMPT-4711"}],
                                completion="SECRET-COMPLETION-0815")
            span.finish(input_tokens=5, output_tokens=5, finish_reason="stop")
        tel.shutdown()
        text = "".join(p.read_text(encoding="utf-8") for p in directory.glob("*.jsonl"))
        assert text  # something was written
        assert ("SECRET-PROMPT-4711" in text) is content
        assert ("SECRET-COMPLETION-0815" in text) is content


def test_from_settings_off_by_default_is_a_noop(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home")
    assert settings.telemetry is False
    tel = Telemetry.from_settings(settings)
    assert not tel.enabled and type(tel) is Telemetry
    with tel.request_span("/v1/chat/completions", model="m") as span:
        span.record_content(prompt="x")
        span.finish(input_tokens=1, output_tokens=1)
        assert span.trace_id == ""
    tel.observe_engine(lambda: None)
    tel.install_logging()
    tel.shutdown()
    assert not settings.telemetry_path.exists()


def test_from_settings_writes_to_telemetry_path(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", telemetry=True, telemetry_dir=tmp_path / "here")
    tel = Telemetry.from_settings(settings, metric_interval_s=3600)
    assert tel.enabled and not tel.content
    with tel.request_span("/healthz"):
        pass
    tel.shutdown()
    assert len(spans(tmp_path / "here")) == 1


def test_unwritable_directory_does_not_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    tel = FileTelemetry(TelemetryConfig(directory=blocker / "telemetry", metric_interval_s=3600))
    tel.install_logging(logging.getLogger("ortserve.test_unwritable"))
    with caplog.at_level(logging.WARNING, logger="ortserve.telemetry"):
        for _ in range(20):
            with tel.request_span("/v1/chat/completions", model="m") as span:
                logging.getLogger("ortserve.test_unwritable").error("still serving")
                span.finish(input_tokens=1, output_tokens=1, finish_reason="stop")
            tel.force_flush()
        tel.shutdown()
    warnings = [r for r in caplog.records if r.name == "ortserve.telemetry"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "cannot write" in warnings[0].getMessage() and "serving continues" in warnings[0].getMessage()
    assert tel.health.dropped >= 3  # traces, logs and metrics were all refused, quietly


def test_slow_disk_does_not_block_requests(tel: FileTelemetry) -> None:
    writer = tel.writers["traces"]
    real = writer.write_line

    disk = threading.Event()  # the disk answers only when the test says so: no timing involved

    def stuck(line: str) -> bool:
        disk.wait(60)
        return real(line)

    def requests() -> None:
        for _ in range(50):
            with tel.request_span("/v1/chat/completions", model="m") as span:
                span.finish(input_tokens=1, output_tokens=1)

    writer.write_line = stuck  # type: ignore[method-assign]
    serving = threading.Thread(target=requests)
    serving.start()
    serving.join(30)  # generous: a loaded machine is slow, but a request blocked on the disk never ends
    assert not serving.is_alive() and not disk.is_set(), "request spans waited for the disk"
    disk.set()
    tel.shutdown()
    assert len(spans(tel.directory)) == 50


def test_hung_disk_drops_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tel = FileTelemetry(TelemetryConfig(directory=tmp_path, metric_interval_s=3600, max_queue=16,
                                        span_delay_s=0.01))
    gate = threading.Event()
    writer = tel.writers["traces"]
    real = writer.write_line

    def hung(line: str) -> bool:
        gate.wait(120)
        return real(line)

    def requests() -> None:
        for _ in range(500):
            with tel.request_span("/v1/chat/completions", model="m") as span:
                span.finish(input_tokens=1, output_tokens=1)

    writer.write_line = hung  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="opentelemetry"):
        serving = threading.Thread(target=requests)
        serving.start()
        serving.join(60)  # event-based: the requests end while the disk is still hung
        finished_while_hung = not serving.is_alive() and not gate.is_set()
    gate.set()
    tel.shutdown()
    drops = [r for r in caplog.records if "Queue full" in r.getMessage()]
    assert len(drops) == 1  # not one per dropped span (the SDK de-duplicates per 20 s)
    assert finished_while_hung  # requests never waited for the disk
    assert 0 < len(spans(tmp_path)) < 500  # what fit in the queue was written, the rest dropped
