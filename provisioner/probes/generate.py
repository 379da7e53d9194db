"""The generation probe: a cluster serves when a greedy completion of a fixed prompt, sent with its API key, comes
back within a bound and says what the cluster said when its configuration was launched (docs/serving.md,
"Readiness"). `GET /health` is only a liveness hint. A probe that is only slow is told busy from stuck by the engine's
token counters on `/metrics`. Pure decisions apart from `probe` and `engine_tokens_at` (one HTTP call each); stdlib.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: roles/provisioner_plan/defaults/main.yml holds the site's values; these are the same defaults for callers
#: that have no inventory context.
PROMPT = "The quick brown fox"
MAX_TOKENS = 4
TIMEOUT_S = 10.0
RECORD_FILE = "/var/lib/provisioner/vllm-probe.json"
MAX_TEXT = 4096  # a node's answer is data: kept short
MAX_METRICS = 4 << 20  # bytes of a head's /metrics page read at most
#: counters the engine core advances as it works, summed over their label sets (vLLM 0.32 V1 engine; prometheus'
#: client adds `_total`). The API server keeps answering /metrics while the engine core is stopped: these stay flat.
PROGRESS_COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
_COUNTER_LINE = re.compile(r'^(?P<name>vllm:[a-z_]+)(?:\{(?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*\})?[ \t]+(?P<value>[^ \t]+)')


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # "" when ok
    text: str | None = None
    latency_s: float | None = None
    #: no answer within the bound, or the right answer after it: what a busy head and a stuck one have in common
    #: (never set for a refused connection, an HTTP error or a wrong answer: those fail whatever the load)
    slow: bool = False


def request_body(model: str, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0}


def answer_text(payload: Any) -> str | None:
    """choices[0].text of an OpenAI completion (parsed JSON), None for any other shape."""
    try:
        text = payload["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None
    return text[:MAX_TEXT] if isinstance(text, str) else None


def verdict(status: int, payload: Any, latency_s: float, expected: str | None, bound_s: float, *,
            timed_out: bool = False) -> Verdict:
    """Serving or not, from one probe's outcome. expected None: no launch record to compare with (any text).
    timed_out: status 0 because the bound ran out (not a refused or broken connection)."""
    if status != 200:
        if not status and timed_out:
            return Verdict(False, f"no answer within {bound_s:g} s", None, latency_s, slow=True)
        return Verdict(False, f"HTTP {status}" if status else "no answer", None, latency_s)
    text = answer_text(payload)
    if text is None:
        return Verdict(False, "not a completion", None, latency_s)
    if latency_s > bound_s:
        return Verdict(False, f"answered in {latency_s:.1f} s > {bound_s:g} s", text, latency_s,
                       slow=expected is None or text == expected)
    if expected is not None and text != expected:
        return Verdict(False, f"answered {text!r}, at launch {expected!r}", text, latency_s)
    return Verdict(True, "", text, latency_s)


def make_record(text: str, cluster: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """What the head keeps (vllm_probe_file): the request and its launch answer. No key in it."""
    return {"cluster": cluster, "model": model, "prompt": prompt, "max_tokens": int(max_tokens), "text": text,
            "recorded_at": int(time.time())}


def parse_record(raw: str | bytes | None) -> dict[str, Any] | None:
    """A record read back from a head (data, checked): None when absent or malformed."""
    if not raw:
        return None
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(rec, dict) and isinstance(rec.get("text"), str) and isinstance(rec.get("prompt"), str)
            and isinstance(rec.get("max_tokens"), int) and isinstance(rec.get("model"), str)):
        return None
    return rec


def launch_decision(text: str, record: Mapping[str, Any] | None, *, configuration_changed: bool, cluster: str,
                    model: str, prompt: str, max_tokens: int) -> tuple[dict[str, Any] | None, str]:
    """At the end of a launch wait: (record to write or None, error or ""). A new configuration, a head without a
    record or a changed probe request records this answer; otherwise the answer must equal the record's."""
    same_request = (record is not None and record.get("prompt") == prompt
                    and record.get("max_tokens") == int(max_tokens) and record.get("model") == model)
    if configuration_changed or not same_request:
        return make_record(text, cluster, model, prompt, max_tokens), ""
    assert record is not None
    if record["text"] != text:
        return None, (f"cluster {cluster}: the generation probe answered {text!r}, but this configuration answered "
                      f"{record['text']!r} at launch (wrong weights, a broken rank or a corrupted engine)")
    return None, ""


def probe(base_url: str, model: str, *, key: str = "", prompt: str = PROMPT, max_tokens: int = MAX_TOKENS,
          expected: str | None = None, bound_s: float = TIMEOUT_S) -> Verdict:
    """POST one probe to `base_url` (http://HOST:PORT) and judge it. The key travels in a header only."""
    req = urllib.request.Request(base_url.rstrip("/") + "/v1/completions",
                                 data=json.dumps(request_body(model, prompt, max_tokens)).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    t0 = time.monotonic()
    status, payload, timed_out = 0, None, False
    try:
        with urllib.request.urlopen(req, timeout=bound_s) as r:  # noqa: S310 - http(s) URL built above
            status = r.status
            payload = json.loads(r.read(1 << 20))
    except urllib.error.HTTPError as e:
        status = e.code
    except urllib.error.URLError as e:  # a connect that timed out comes wrapped
        timed_out = isinstance(e.reason, TimeoutError)
    except TimeoutError:  # the answer did not come within the bound (socket.timeout)
        timed_out = True
    except (OSError, ValueError):
        status = 0
    return verdict(status, payload, time.monotonic() - t0, expected, bound_s, timed_out=timed_out)


def engine_tokens(page: str) -> float | None:
    """Tokens the engine has processed (PROGRESS_COUNTERS summed over their label sets) from a Prometheus text page;
    None when none of them is there. A node's page is data: other and malformed lines are skipped."""
    total, seen = 0.0, False
    for line in page.splitlines():
        if not line.startswith("vllm:"):
            continue
        m = _COUNTER_LINE.match(line)
        if m is None or m["name"] not in PROGRESS_COUNTERS:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            total, seen = total + value, True
    return total if seen else None


def busy(before: float | None, after: float | None) -> bool:
    """A slow head is busy (not stuck) when its engine processed tokens while the probe waited."""
    return before is not None and after is not None and after > before


def engine_tokens_at(base_url: str, timeout_s: float = 3.0) -> float | None:
    """`engine_tokens` of GET base_url/metrics (vLLM serves it on the API port without the key); None when the page
    cannot be read within timeout_s or has no counter. Reads MAX_METRICS bytes at most (a cut last line dropped)."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as r:  # noqa: S310
            if r.status != 200:
                return None
            raw = r.read(MAX_METRICS + 1)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if len(raw) > MAX_METRICS:
        raw = raw[:MAX_METRICS].rpartition(b"\n")[0]
    return engine_tokens(raw.decode("utf-8", "replace"))


# Runs ON the head (python3, stdlib): the probe against 127.0.0.1 with the key read from the vLLM env file (it never
# leaves the head, never in argv) and the request of the head's launch record. Prints one JSON line: status,
# payload (the response), latency_s, record (the record file's text or null).
_HEAD_SCRIPT = r"""
import json, sys, time, urllib.error, urllib.request
port, rec_path, env_path, model, prompt, max_tokens, bound = sys.argv[1:8]
key = ""
try:
    for ln in open(env_path, encoding="utf-8"):
        if ln.startswith("VLLM_API_KEY="):
            v = ln.split("=", 1)[1].rstrip("\n")
            if len(v) >= 2 and v[0] == v[-1] == '"':
                v = v[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            key = v
except OSError:
    pass
raw = None
try:
    raw = open(rec_path, encoding="utf-8").read(65536)
    rec = json.loads(raw)
    model, prompt, max_tokens = rec["model"], rec["prompt"], rec["max_tokens"]
except (OSError, ValueError, KeyError, TypeError):
    pass
body = json.dumps({"model": model, "prompt": prompt, "max_tokens": int(max_tokens), "temperature": 0}).encode()
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % port, data=body, method="POST",
                             headers={"Content-Type": "application/json"})
if key:
    req.add_header("Authorization", "Bearer " + key)
t0 = time.monotonic()
status, payload = 0, None
try:
    with urllib.request.urlopen(req, timeout=float(bound)) as r:
        status, payload = r.status, json.loads(r.read(1 << 20))
except urllib.error.HTTPError as e:
    status = e.code
except Exception:
    status = 0
print(json.dumps({"status": status, "payload": payload, "latency_s": time.monotonic() - t0, "record": raw}))
"""


def head_command(port: int, model: str, *, record_file: str = RECORD_FILE, env_file: str = "/etc/vllm/vllm.env",
                 prompt: str = PROMPT, max_tokens: int = MAX_TOKENS, bound_s: float = TIMEOUT_S) -> str:
    """Shell for the head (run as root: the env file is root:vllm 0640): one probe, its outcome as a JSON line."""
    import shlex

    args = [str(port), record_file, env_file, model, prompt, str(int(max_tokens)), str(bound_s)]
    return "python3 -c " + " ".join(shlex.quote(a) for a in (_HEAD_SCRIPT, *args))


def head_verdict(stdout: str, bound_s: float = TIMEOUT_S) -> Verdict:
    """The head's JSON line (data: checked) judged against its own launch record."""
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
        status, latency = int(out["status"]), float(out["latency_s"])
    except (ValueError, KeyError, TypeError, IndexError):
        return Verdict(False, "the head's probe printed no result")
    rec = parse_record(out.get("record"))
    return verdict(status, out.get("payload"), latency, rec["text"] if rec else None, bound_s)
