"""Helpers shared by the test layers (unit/, mock/, server/); fixtures live in conftest.py.

- paths: ``ROOT`` (the checkout), ``REPO`` (its ``model_repository``), ``FIXTURES``;
- router variants for a test copy of the model repository (:func:`make_test_repository`);
- :func:`call` / :func:`routes`: one HTTP request to a real server's router or ensemble;
- for the execution-environment tests: :func:`make_wheel` (a wheel of the tiny
  ``envprobe`` package, written with zipfile, no network), :func:`cached_wheel` (a binary
  wheel for another CPython version, downloaded once into ``<repo>/.cache/wheels``),
  :func:`fake_env` (an unpacked env laid out like a venv-pack/conda-pack env) and
  :func:`make_elf` (a minimal ELF64 shared object with chosen symbol versions).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import yaml

from orchestrator.tooling import repository

ROOT = Path(__file__).resolve().parent.parent
REPO = ROOT / "model_repository"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ENV_FIXTURES = FIXTURES / "env"
WHEEL_CACHE = ROOT / ".cache" / "wheels"
SERVER_PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
# The env's Python must differ from the server's (whose stub is this interpreter's version).
ENV_PY = "3.12" if SERVER_PY != "3.12" else "3.11"


# ----------------------------------------------------------------------------- router variants

# Test-only router variants added to a copy of the repository: same code, the default
# policy with the cascade margin changed.
ROUTER_VARIANTS = {
    # every non-empty text escalates: its answers must equal the ensemble's
    "router_accurate": {"cascade": {"margin": 1.0}},
    # never escalates
    "router_fast": {"cascade": {"margin": 0.0}},
}
# The shipped policy with the tokenizer and postprocess models called through BLS.
BLS_VARIANT = "router_bls"


def set_node_fields(node, changes):
    """Apply ``{node name: {field: value}}`` to a policy document's node tree, in place."""
    if isinstance(node, dict):
        if node.get("name") in changes:
            node.update(changes[node["name"]])
        for value in node.values():
            set_node_fields(value, changes)
    elif isinstance(node, list):
        for value in node:
            set_node_fields(value, changes)


def add_router_variant(repo: Path, name: str, policy_document) -> Path:
    """Add model ``name``: the router's code and config (renamed, through the repository
    module) with its own policy document."""
    dest = repo / name
    (dest / "1").mkdir(parents=True)
    shutil.copy(REPO / "router" / "1" / "model.py", dest / "1" / "model.py")
    config = repository.read_config(REPO / "router" / "config.pbtxt")
    config.name = name
    repository.write_config(dest / "config.pbtxt", config, [f"Test-only router variant {name} (tests/helpers.py)."])
    (dest / "policy.yaml").write_text(yaml.safe_dump(policy_document, sort_keys=False))
    return dest


def copy_model(repo: Path, source: str, name: str) -> Path:
    """Copy model directory ``source`` to ``name`` within ``repo``, renaming it in its configs."""
    repository.copy_model(repo / source, repo / name)
    return repo / name


def _ondemand_policy(model: str, idle: float) -> dict:
    fast = {"kind": "model", "model": "classifier_fast"}
    return {
        "version": 1,
        "request_parameters": {"route": ["spare"]},
        "root": {
            "kind": "switch",
            "cases": [
                {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}},
                {
                    "when": {"param": {"name": "route", "equals": "spare"}},
                    "then": {"kind": "model", "model": model, "on_demand": {"idle_timeout_s": idle, "retry_after_s": 30}},
                },
            ],
            "default": fast,
        },
    }


# Models of the test repository that the session server does not load at start.
NOT_LOADED_AT_START = ("classifier_spare", "router_bad_policy")


def make_test_repository(dest: Path) -> Path:
    """Copy ``model_repository`` to ``dest`` and add the test-only models: the
    :data:`ROUTER_VARIANTS`, the shipped A/B example (``router_ab``), on-demand routers and
    their spare classifier, a router whose on-demand model is in no repository, and a
    router with an invalid policy."""
    # not the execution-environment artifacts `make env` may have installed (~120 MB a model)
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*", "env.pbtxt"))
    for name, changes in ROUTER_VARIANTS.items():
        document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
        set_node_fields(document, changes)
        add_router_variant(dest, name, document)
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document.pop("inline")
    add_router_variant(dest, BLS_VARIANT, document)
    add_router_variant(dest, "router_ab", yaml.safe_load((ROOT / "docs" / "policies" / "ab_fallback.yaml").read_text()))
    copy_model(dest, "classifier_fast", "classifier_spare")
    add_router_variant(dest, "router_ondemand", _ondemand_policy("classifier_spare", idle=2.0))
    # on_demand on a model the server loaded itself: the router must never unload it
    add_router_variant(dest, "router_not_owner", _ondemand_policy("classifier_fast", idle=0.5))
    # on_demand on a model in no repository, retried at once: no load request may be sent
    absent = {"kind": "model", "model": "classifier_absent", "on_demand": {"idle_timeout_s": 60, "retry_after_s": 0}}
    spare = {"kind": "model", "name": "spare", "model": "classifier_fast", "route": "fallback"}
    add_router_variant(dest, "router_absent", {"version": 1, "root": {"kind": "fallback", "nodes": [absent, spare]}})
    add_router_variant(dest, "router_bad_policy", {"version": 1, "root": {"kind": "cascade", "margin": 0.1, "stages": [{"kind": "model"}]}})
    return dest


# ----------------------------------------------------------------------------- requests


def call(server, model, texts, thresholds=0.5, parameters=None, text_array=None, thr_array=None):
    """One request; returns dict of outputs or raises InferenceServerException."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, network_timeout=120)
    inputs = []
    t = text_array if text_array is not None else np.array([s.encode() if isinstance(s, str) else s for s in texts], dtype=np.object_).reshape(-1, 1)
    if t is not False:
        dtype = "BYTES" if t.dtype == np.object_ else "FP32"
        inputs.append(httpclient.InferInput("TEXT", list(t.shape), dtype))
        inputs[-1].set_data_from_numpy(t)
    thr = thr_array if thr_array is not None else np.full((len(texts), 1), thresholds, dtype=np.float32)
    if thr is not False:
        inputs.append(httpclient.InferInput("THRESHOLD", list(thr.shape), "FP32"))
        inputs[-1].set_data_from_numpy(thr)
    try:
        result = client.infer(model, inputs, parameters=parameters)
        names = [o["name"] for o in result.get_response()["outputs"]]
        return {n: result.as_numpy(n) for n in names}
    finally:
        client.close()


def routes(out):
    return [r.decode() for r in out["ROUTE"].reshape(-1)]


# ----------------------------------------------------------------------------- execution environments


def make_wheel(dest: Path, name: str = "envprobe", version: str = "0.1.0") -> Path:
    """Zip ``tests/fixtures/env/<name>_src/<name>/`` into a pure-Python wheel in ``dest``
    (``_src``: so this directory on ``sys.path`` does not make ``<name>`` importable)."""
    dest.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    source = ENV_FIXTURES / f"{name}_src" / name
    for path in sorted(source.rglob("*.py")):
        files[f"{name}/{path.relative_to(source).as_posix()}"] = path.read_bytes()
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: envhelpers\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for arc, data in files.items():
            zf.writestr(arc, data)
    return wheel


def cached_wheel(project: str, version: str, python: str) -> Path:
    """The manylinux x86_64 wheel of ``project==version`` for CPython ``python`` ("3.12") in
    the wheel cache, downloaded with pip the first time. Raises RuntimeError (with pip's
    output) when it cannot be had."""
    tag = "cp" + python.replace(".", "")
    pattern = f"{project}-{version}-{tag}-{tag}-*.whl"
    found = sorted(WHEEL_CACHE.glob(pattern))
    if found:
        return found[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
         "-d", str(WHEEL_CACHE), f"{project}=={version}"],
        capture_output=True, text=True,
    )
    found = sorted(WHEEL_CACHE.glob(pattern))
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"cannot download {project}=={version} for Python {python}: {proc.stdout}{proc.stderr}")
    return found[0]


def fake_env(
    root: Path,
    python: str = "3.12",
    *,
    numpy: str | None = "1.26.4",
    activate: bool = True,
    libpython: Path | None = None,
    home: str | None = None,
    flavour: str = "venv",
) -> Path:
    """An unpacked env directory at ``root`` with the files the doctor reads: ``pyvenv.cfg``
    (venv; ``home`` default: pyenv's bin of that version) or ``conda-meta/python-*.json``,
    ``bin/activate``, ``lib/python3.X/site-packages/numpy-<v>.dist-info/METADATA`` and
    ``lib/<libpython>`` when given (a copy)."""
    site = root / "lib" / f"python{python}" / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(parents=True, exist_ok=True)
    if flavour == "venv":
        if home is None:
            versions = sorted((Path.home() / ".pyenv" / "versions").glob(f"{python}.*"))
            home = str(versions[-1] / "bin") if versions else "/nonexistent/bin"
        (root / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\nversion = {python}.0\n")
    else:
        (root / "conda-meta").mkdir(exist_ok=True)
        (root / "conda-meta" / f"python-{python}.0-h0_0.json").write_text("{}")
    if activate:
        (root / "bin" / "activate").write_text('export PATH="$(dirname "${BASH_SOURCE[0]}"):$PATH"\n')
    if numpy:
        dist = site / f"numpy-{numpy}.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: numpy\nVersion: {numpy}\n")
    if libpython is not None:
        (root / "lib" / libpython.name).write_bytes(libpython.read_bytes())
    return root


def make_elf(path: Path, *, needs: Sequence[tuple[str, Iterable[str]]] = (), defs: Iterable[str] = ()) -> Path:
    """Write a minimal little-endian ELF64 shared object to ``path``.

    ``needs``: ``[(soname, [version names])]`` for ``.gnu.version_r`` (what a C++ extension
    built against a newer libstdc++ carries); ``defs``: version names for
    ``.gnu.version_d`` (what a ``libstdc++.so.6`` carries). No code, no dynamic section:
    enough for a reader of section headers (the doctor's), not for the loader.
    """
    strtab = bytearray(b"\0")

    def s(name: str) -> int:
        off = len(strtab)
        strtab.extend(name.encode() + b"\0")
        return off

    verneed = bytearray()
    needs = list(needs)
    for i, (soname, versions) in enumerate(needs):
        versions = list(versions)
        file_off = s(soname)
        aux = bytearray()
        for j, v in enumerate(versions):
            nxt = 16 if j < len(versions) - 1 else 0
            aux += struct.pack("<IHHII", 0, 0, 2 + j, s(v), nxt)
        nxt = 16 + len(aux) if i < len(needs) - 1 else 0
        verneed += struct.pack("<HHIII", 1, len(versions), file_off, 16, nxt) + aux
    verdef = bytearray()
    defs = ["libstdc++.so.6", *defs] if defs else []
    for i, v in enumerate(defs):
        nxt = 28 if i < len(defs) - 1 else 0
        flags = 1 if i == 0 else 0  # VER_FLG_BASE on the file's own entry
        verdef += struct.pack("<HHHHIII", 1, flags, i + 1, 1, 0, 20, nxt) + struct.pack("<II", s(v), 0)
    shstr = b"\0.dynstr\0.gnu.version_r\0.gnu.version_d\0.shstrtab\0"
    body = bytearray(64)
    sections = [(0, 0, 0, 0, 0, 0)]  # name, type, offset, size, link, info

    def add(name_off, stype, data, link=0, info=0):
        off = len(body)
        body.extend(data)
        sections.append((name_off, stype, off, len(data), link, info))

    add(1, 3, bytes(strtab))  # .dynstr (SHT_STRTAB), index 1
    if needs:
        add(9, 0x6FFFFFFE, bytes(verneed), link=1, info=len(needs))
    if defs:
        add(24, 0x6FFFFFFD, bytes(verdef), link=1, info=len(defs))
    add(39, 3, shstr)
    shoff = len(body)
    for name, stype, off, size, link, info in sections:
        body += struct.pack("<IIQQQQIIQQ", name, stype, 0, 0, off, size, link, info, 1, 0)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections), len(sections) - 1)
    body[:64] = header
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(body))
    return path


def build_probe_env(tmp: Path, numpy_version: str, verify: bool, project: bool = False):
    """A venv-pack'ed env of ``ENV_PY`` with ``numpy_version`` and ``envprobe`` (and this
    checkout's package when ``project``); skips the test when the numpy wheel cannot be had."""
    from orchestrator.tooling.env import envtools

    probe = make_wheel(tmp / "wheels")
    try:
        numpy_wheel = cached_wheel("numpy", numpy_version, ENV_PY)
    except RuntimeError as exc:
        import pytest

        pytest.skip(str(exc))
    return envtools.build_env(
        ENV_PY,
        requirements=[f"numpy=={numpy_version}", "envprobe==0.1.0"],
        pip_args=["--no-index", "--find-links", str(probe.parent), "--find-links", str(numpy_wheel.parent)],
        install_project=project,
        imports=["numpy", "envprobe", "triton_python_backend_utils"]
        + (["orchestrator.runtime.validation", "orchestrator.runtime.models.postprocess"] if project else []),
        verify=verify,
        output=tmp / "out" / envtools.ENV_TARBALL_NAME,
        quiet=True,
    )


def probe_repo(dest: Path, name: str = "probe") -> Path:
    """Add the env-probe model (tests/fixtures/env/models/probe) to ``dest`` as ``name``."""
    model = dest / name
    shutil.copytree(ENV_FIXTURES / "models" / "probe", model, ignore=shutil.ignore_patterns("__pycache__"))
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "probe"', f'name: "{name}"'))
    return dest
