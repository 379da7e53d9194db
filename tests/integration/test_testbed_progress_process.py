"""`provisioner_testbed.progress.run_logged` with a real process: every line reaches the log and the line callback
as it comes, ticks keep coming while the process is silent, the exit status and (on request) the output come back."""

from __future__ import annotations

import io
import time
from pathlib import Path

from provisioner_testbed.progress import MARKER, Phases, build_phase, run_logged


def test_run_logged_streams_lines_and_ticks_through_silence(tmp_path: Path) -> None:
    script = "echo '== [10:00:00] venv /opt/vllm/venv'; sleep 1.2; echo quiet; echo '== [10:00:02] done'; exit 3"
    seen: list[tuple[float, str]] = []
    ticks: list[float] = []
    log = io.StringIO()
    t0 = time.monotonic()
    ran = run_logged(["bash", "-c", script], log, on_line=lambda ln: seen.append((time.monotonic() - t0, ln)),
                     on_tick=lambda: ticks.append(time.monotonic() - t0), tick_s=0.2, keep_output=True)
    assert ran.rc == 3
    assert [ln for _, ln in seen] == ["== [10:00:00] venv /opt/vllm/venv", "quiet", "== [10:00:02] done"]
    assert seen[0][0] < 1.0  # streamed, not at the end
    assert log.getvalue() == ran.output == "== [10:00:00] venv /opt/vllm/venv\nquiet\n== [10:00:02] done\n"
    assert len([t for t in ticks if t < 1.2]) >= 3  # the silent second still ticks

    # the layer build's wiring: markers drive the phase lines
    p, lines = Phases("vLLM layer", 0.0, total=1), []
    for _, ln in seen:
        m = MARKER.match(ln)
        if m:
            name = build_phase(m.group(1))
            lines += p.start(name, 0.0) if name else p.finish(5.0)
    assert lines == ["vLLM layer: creating the venv with the base root's python3.11 (phase 1/1) ...",
                     "vLLM layer: creating the venv with the base root's python3.11: done in 5 s"]
