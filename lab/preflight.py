"""Checks the machine before ``make`` builds the project virtualenv, then builds or reuses it.

Run by the Makefile as a plain script with the interpreter the user chose (``$(PYTHON)``,
default ``python3``), before anything is installed, so it imports nothing from this package
or outside the standard library and keeps to syntax an old ``python3`` can parse (it must
be able to say "too old"):

    python3 lab/preflight.py --venv .venv [--extras serve,test,train]

1. The interpreter: at least the ``requires-python`` of ``pyproject.toml`` (the pins need
   it: transformers 5.23.0 declares Requires-Python >= 3.11 and onnxruntime 1.31.1 has
   wheels for CPython 3.11+ only), with the ``venv`` module.
2. The platform: Linux x86_64 with glibc 2.35 or newer (the ``nvidia-pytriton`` wheel that
   carries the embedded Triton server is ``manylinux_2_35``). ``ORCHESTRATOR_SKIP_PLATFORM_CHECK=1``
   skips this check (an untested platform: pip may then fail to find a wheel).
3. The virtualenv: one made by another interpreter is rebuilt (never reused); the stamp
   ``<venv>/.installed`` records the interpreter, the extras installed and the hash of
   ``pyproject.toml``; pip runs (with its progress shown) only when one of them changed.

Each problem is printed with what to install; the exit status is 2 then.
"""

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_GLIBC = (2, 35)
SKIP_PLATFORM = "ORCHESTRATOR_SKIP_PLATFORM_CHECK"
#: what each extra adds, said before pip runs (the first install takes minutes)
EXTRAS_WHY = {
    "": "numpy, PyYAML, tokenizers (the runtime)",
    "serve": "nvidia-pytriton (a complete Triton 2.51 server, the largest download), tritonclient, prometheus-client, "
             "rich, and onnxruntime for the repository's Python models (make demo, make serve)",
    "client": "tritonclient (orchestrator classify, policy, deploy, frontdoor)",
    "export": "transformers, torch 2.13.0, onnx, onnxruntime (orchestrator export, parity, warmup)",
    "tune": "scipy, matplotlib, onnxruntime, tritonclient (orchestrator calibrate, tune)",
    "env": "venv-pack, conda-pack, nvidia-pytriton (make env, make stub)",
    "test": "pytest, ruff, mypy, jsonschema, matplotlib, scipy, opentelemetry-proto, py-spy (make test and the lab)",
    "train": "torch 2.13.0, onnx, onnxruntime, transformers, vaderSentiment (make model; the tests that export; the "
             "largest download: a CPU build where your index has one, else several GB of CUDA wheels)",
}


def requires_python(pyproject_text: str) -> Tuple[int, int]:
    """The ``(major, minor)`` of ``requires-python = ">=X.Y"`` in ``pyproject.toml``'s text."""
    m = re.search(r'^requires-python\s*=\s*">=\s*(\d+)\.(\d+)', pyproject_text, re.M)
    if not m:
        raise ValueError('pyproject.toml has no requires-python = ">=X.Y"')
    return int(m.group(1)), int(m.group(2))


def parse_glibc(text: str) -> Optional[Tuple[int, int]]:
    """``"2.35"`` or ``"glibc 2.35"`` -> ``(2, 35)``; None when it names no version."""
    m = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def glibc_version() -> Optional[Tuple[int, int]]:
    """This process's glibc, or None where there is none (musl, macOS, Windows)."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
    except (AttributeError, ValueError, OSError):
        found = None
    if not found:
        lib, ver = platform.libc_ver()
        found = ver if lib == "glibc" else ""
    return parse_glibc(found or "")


def check_interpreter(version: Sequence[int], minimum: Tuple[int, int], has_venv: bool, executable: str) -> List[str]:
    """Problems with the interpreter, each with what to install; empty when it will do."""
    have = "%d.%d.%d" % tuple(version[:3])
    want = "%d.%d" % minimum
    problems = []
    if tuple(version[:2]) < minimum:
        problems.append(
            "Python %s (%s) is too old: orchestrator needs Python %s or newer (transformers 5.23.0 requires it and "
            "onnxruntime 1.31.1 has wheels for CPython %s+ only).\n"
            "  Install one, e.g. `uv python install 3.12`, `pyenv install 3.12`, or on Debian/Ubuntu "
            "`sudo apt install python3.12 python3.12-venv` (Ubuntu 22.04: the deadsnakes PPA),\n"
            "  then run make with it: `make demo PYTHON=python3.12`." % (have, executable, want, want))
    elif not has_venv:
        short = "%d.%d" % tuple(version[:2])
        problems.append(
            "Python %s (%s) has no working `venv` module (ensurepip is missing).\n"
            "  Debian/Ubuntu: `sudo apt install python%s-venv`, then run make again." % (have, executable, short))
    return problems


def check_platform(system: str, machine: str, glibc: Optional[Tuple[int, int]]) -> List[str]:
    """Problems with the OS, CPU or C library, each with what to do instead; empty when supported."""
    container = ("  Use the NGC Triton container instead (README, \"Use with the NGC Triton container\"), "
                 "or a Linux x86_64 machine or VM.")
    if system != "Linux":
        return ["%s is not supported for the local set-up: the embedded Triton server comes from the nvidia-pytriton "
                "0.7.0 wheel, published for Linux only (manylinux_2_35).\n%s" % (system or "This OS", container)]
    problems = []
    if machine not in ("x86_64", "AMD64"):
        problems.append("Linux %s is untested: the set-up is checked on Linux x86_64 only (set %s=1 to try anyway; "
                        "pip then fails if a pinned package has no wheel for %s).\n%s" % (machine, SKIP_PLATFORM, machine,
                                                                                          container))
    if glibc is None:
        problems.append("No glibc found (musl, e.g. Alpine?): the nvidia-pytriton wheel needs glibc %d.%d or newer.\n%s"
                        % (MIN_GLIBC + (container,)))
    elif glibc < MIN_GLIBC:
        problems.append("glibc %d.%d is too old: the nvidia-pytriton 0.7.0 wheel (the embedded Triton server) is "
                        "manylinux_2_35 and needs glibc %d.%d or newer (Ubuntu 22.04+, Debian 12+, RHEL 10+; not Ubuntu "
                        "20.04 or RHEL 8/9).\n%s" % (glibc + MIN_GLIBC + (container,)))
    return problems


def read_cfg(venv: str) -> Optional[Dict[str, str]]:
    """``<venv>/pyvenv.cfg`` as a dict, or None when there is none."""
    path = os.path.join(venv, "pyvenv.cfg")
    if not os.path.isfile(path):
        return None
    out = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.partition("=")
            if sep:
                out[key.strip()] = value.strip()
    return out


def venv_verdict(venv: str, version: str) -> Tuple[str, str]:
    """``("create" | "reuse" | "rebuild" | "refuse", why)`` for the virtualenv directory *venv*.

    *version* is the running interpreter's ``X.Y.Z``. A virtualenv made by another
    interpreter version (its ``pyvenv.cfg``) is rebuilt; a directory that is not a virtualenv
    is refused (never deleted).
    """
    if not os.path.exists(venv):
        return "create", "%s does not exist" % venv
    cfg = read_cfg(venv)
    if cfg is None:
        if os.path.isdir(venv) and not os.listdir(venv):
            return "create", "%s is empty" % venv
        return "refuse", ("%s exists but is not a virtualenv (no pyvenv.cfg); remove it or pick another VENV=" % venv)
    made_by = cfg.get("version") or cfg.get("version_info", "")
    if not made_by.startswith(version):
        return "rebuild", ("%s was made by Python %s (%s), not by this Python %s"
                           % (venv, made_by or "of unknown version", cfg.get("home", "?"), version))
    if not os.path.isfile(os.path.join(venv, "bin", "python")):
        return "rebuild", "%s has no bin/python (a half-made virtualenv)" % venv
    return "reuse", "%s was made by this Python %s" % (venv, version)


def read_stamp(path: str) -> Dict[str, object]:
    """The stamp's record; ``{}`` when missing or from before stamps recorded anything."""
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def needs_install(stamp: Dict[str, object], extras: Sequence[str], pyproject_sha: str) -> Optional[str]:
    """Why pip must run for *extras*, or None when the stamp says they are installed as they are."""
    if not stamp:
        return "first install"
    if stamp.get("pyproject_sha256") != pyproject_sha:
        return "pyproject.toml changed"
    missing = sorted(set(extras) - set(stamp.get("extras") or []))  # type: ignore[arg-type]
    if missing:
        return "extras not installed yet: " + ", ".join(missing)
    return None


def run(cmd: List[str]) -> None:
    """Run *cmd*, showing it and its output; exit with its status if it fails."""
    print("+ " + " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc:
        sys.exit(rc)


#: The project's distribution name before ``triton-orchestrator`` (PyPI's ``orchestrator`` is
#: another project); a virtualenv made before the rename still holds it.
OLD_DIST = "orchestrator"


def stale_old_install(venv: str) -> bool:
    """True when *venv* holds this checkout installed under :data:`OLD_DIST` (its
    ``direct_url.json`` points here): two editable installs would both claim the module
    ``orchestrator``. The unrelated PyPI project of that name (no such URL) is left alone."""
    import glob

    for path in glob.glob(os.path.join(venv, "lib", "python*", "site-packages", OLD_DIST + "-*.dist-info", "direct_url.json")):
        try:
            with open(path) as f:
                url = json.load(f).get("url", "")
        except (OSError, ValueError):
            continue
        if url.rstrip("/") == "file://" + ROOT.rstrip("/"):
            return True
    return False


def ensure_venv(venv: str, extras: List[str], version: str) -> int:
    """Create, rebuild or reuse *venv*, install the package with *extras*; 0, or 2 on a refusal."""
    verdict, why = venv_verdict(venv, version)
    if verdict == "refuse":
        print("error: " + why, file=sys.stderr)
        return 2
    if verdict == "rebuild":
        print("Rebuilding the virtualenv: %s." % why, flush=True)
        shutil.rmtree(venv)
    if verdict in ("create", "rebuild"):
        print("Creating %s with Python %s (%s)." % (venv, version, sys.executable), flush=True)
        run([sys.executable, "-m", "venv", venv])
    stamp_path = os.path.join(venv, ".installed")
    stamp = read_stamp(stamp_path) if verdict == "reuse" else {}
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    reason = needs_install(stamp, extras, sha)
    if reason is None:
        return 0
    installed = sorted(set(extras) | set(stamp.get("extras") or []))  # type: ignore[arg-type]
    py = os.path.join(venv, "bin", "python")
    print("Installing orchestrator into %s (%s). It brings:" % (venv, reason), flush=True)
    for extra in [""] + installed:
        print("  %s: %s" % ("[%s]" % extra if extra else "the package", EXTRAS_WHY.get(extra, extra)))
    print("The first install downloads a few hundred MB%s; pip shows each package." %
          (" (several GB with torch)" if {"train", "export"} & set(installed) else ""), flush=True)
    run([py, "-m", "pip", "install", "--upgrade", "pip"])
    if stale_old_install(venv):
        print("Removing this checkout's install under its old name %r (now triton-orchestrator)." % OLD_DIST, flush=True)
        run([py, "-m", "pip", "uninstall", "--yes", OLD_DIST])
    spec = ROOT + ("[%s]" % ",".join(installed) if installed else "")
    run([py, "-m", "pip", "install", "--progress-bar", "on", "-e", spec])
    with open(stamp_path, "w") as f:
        json.dump({"python": sys.executable, "version": version, "extras": installed, "pyproject_sha256": sha}, f)
    return 0


def has_venv_module() -> bool:
    """True when ``python -m venv`` can make a virtualenv with pip (Debian splits ensurepip off)."""
    try:
        import ensurepip  # noqa: F401
        import venv  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", help="build or reuse this virtualenv after the checks (default: only check)")
    ap.add_argument("--extras", default="", help="comma-separated extras of pyproject.toml to install (e.g. serve,test)")
    args = ap.parse_args(argv)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        minimum = requires_python(f.read())
    problems = check_interpreter(sys.version_info, minimum, has_venv_module(), sys.executable)
    if not os.environ.get(SKIP_PLATFORM):
        problems += check_platform(platform.system(), platform.machine(), glibc_version())
    if problems:
        for p in problems:
            print("error: " + p, file=sys.stderr)
        return 2
    if not args.venv:
        print("ok: Python %s, %s %s, glibc %s" % (platform.python_version(), platform.system(), platform.machine(),
                                                   "%d.%d" % (glibc_version() or (0, 0))))
        return 0
    extras = [e for e in args.extras.split(",") if e.strip()]
    return ensure_venv(args.venv, extras, platform.python_version())


if __name__ == "__main__":
    sys.exit(main())
