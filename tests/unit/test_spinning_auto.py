"""thread_spinning = auto: ONNX Runtime's threads spin on an idle machine, not on a busy one."""

from __future__ import annotations

from ortserve.config import load_settings
from ortserve.engine.runtime import spinning_wanted


def test_auto_spins_only_when_the_machine_is_idle() -> None:
    assert spinning_wanted("auto", loadavg=lambda: (0.3, 0.2, 0.1), cores=2) is True
    assert spinning_wanted("auto", loadavg=lambda: (1.5, 1.0, 1.0), cores=2) is False
    assert spinning_wanted(True, loadavg=lambda: (9.0, 9.0, 9.0), cores=2) is True   # explicit wins
    assert spinning_wanted(False, loadavg=lambda: (0.0, 0.0, 0.0), cores=2) is False


def test_no_load_average_means_no_spinning() -> None:
    def windows() -> tuple[float, float, float]:
        raise OSError("no load average on this platform")
    assert spinning_wanted("auto", loadavg=windows, cores=8) is False


def test_the_setting_takes_auto_and_booleans(monkeypatch) -> None:
    assert load_settings().thread_spinning == "auto"
    monkeypatch.setenv("ORTSERVE_THREAD_SPINNING", "1")
    assert load_settings().thread_spinning is True
    monkeypatch.setenv("ORTSERVE_THREAD_SPINNING", "0")
    assert load_settings().thread_spinning is False
    monkeypatch.setenv("ORTSERVE_THREAD_SPINNING", "auto")
    assert load_settings().thread_spinning == "auto"
