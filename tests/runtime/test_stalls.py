"""The stall tracer (consensus/runtime/stalls.py): when the loop's timer is late past
the threshold, the main thread's stack goes to the log, with the runtime's recent steps
and the thread's kernel state, so a pause can be traced to its cause."""

from __future__ import annotations

import threading
import time

from consensus.runtime.stalls import StallTracer, log_path, threshold_from_env


def _a_long_callback(seconds: float) -> None:
    time.sleep(seconds)  # stands for a loop callback that does not return


def test_a_late_timer_reports_where_the_main_thread_was(tmp_path):
    assert threading.current_thread() is threading.main_thread()
    path = tmp_path / "stalls.log"
    due = [time.monotonic() + 0.02]
    tracer = StallTracer(str(path), lambda: due[0], threshold_ms=30)
    tracer.start()
    try:
        tracer.note("fork")
        _a_long_callback(0.25)  # the "timer" is due 20 ms in and never runs
        t = time.monotonic() + 5
        while tracer.reports < 2 and time.monotonic() < t:
            time.sleep(0.01)
    finally:
        tracer.stop()
    text = path.read_text()
    assert text.count("--- STALL") >= 2
    assert "_a_long_callback" in text and "time.sleep(seconds)" in text
    assert "[recent steps]" in text and "fork" in text
    n = tracer.reports
    time.sleep(0.05)
    assert tracer.reports == n  # stopped


def test_no_report_while_the_timer_runs_on_time(tmp_path):
    path = tmp_path / "stalls.log"
    due = [time.monotonic() + 10]
    tracer = StallTracer(str(path), lambda: due[0], threshold_ms=30)
    tracer.start()
    time.sleep(0.1)
    tracer.stop()
    assert tracer.reports == 0 and not path.exists()


def test_the_switches(monkeypatch, tmp_path):
    monkeypatch.delenv("CELLAR_STALL_TRACE_MS", raising=False)
    assert threshold_from_env() is None
    for raw, want in (("30", 30.0), ("x", None), ("0", None), ("-5", None)):
        monkeypatch.setenv("CELLAR_STALL_TRACE_MS", raw)
        assert threshold_from_env() == want
    monkeypatch.delenv("CELLAR_STALL_TRACE_DIR", raising=False)
    assert log_path("/d", 2) == "/d/stalls.log"
    monkeypatch.setenv("CELLAR_STALL_TRACE_DIR", str(tmp_path))
    assert log_path("/d", 2) == str(tmp_path / "stalls-2.log")
