"""The export's conversions: float16 weights (onnxruntime's converter) and TensorRT plans (trtexec)."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path

from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.modeling.configs import MAX_BATCH_SIZE
from orchestrator.tooling.modeling.contract import ExportError, ExportValidationError

TRTEXEC_TIMEOUT_S = 3600


def convert_to_fp16(src: Path, dst: Path) -> None:
    """Convert the ONNX model ``src`` to float16 into ``dst`` (one file, written atomically).

    ``onnxruntime.transformers.float16.convert_float_to_float16(model, keep_io_types=True)``
    (defaults otherwise: values below 5.96e-8 / above 65504 in magnitude are clamped, ops in
    its default block list stay float32). ``keep_io_types`` keeps the graph inputs
    (int64) and the ``logits`` output float32, with Cast nodes inside. Raises
    :class:`ExportValidationError` if the result fails ``onnx.checker``.
    """
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp16 = convert_float_to_float16(model, keep_io_types=True)
    try:
        onnx.checker.check_model(fp16)
    except onnx.checker.ValidationError as e:
        raise ExportValidationError(f"fp16 model from {src} fails onnx.checker: {e}") from e
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(dst, fp16.SerializeToString(), 0o644)


def trtexec_command(onnx_path: Path, plan_path: Path, max_length: int, fp16: bool) -> list[str]:
    """The ``trtexec`` command that builds ``plan_path``: one optimisation profile, batch
    1..64 (opt 16), sequence 1..``max_length`` (opt ``max_length``); ``--fp16`` for fp16."""
    shapes = {"min": (1, 1), "opt": (16, max_length), "max": (MAX_BATCH_SIZE, max_length)}
    cmd = [shutil.which("trtexec") or "trtexec", f"--onnx={onnx_path}", f"--saveEngine={plan_path}"]
    for kind, (b, s) in shapes.items():
        cmd.append(f"--{kind}Shapes=input_ids:{b}x{s},attention_mask:{b}x{s}")
    if fp16:
        cmd.append("--fp16")
    return cmd


def build_tensorrt_plan(onnx_path: Path, plan_path: Path, max_length: int, fp16: bool) -> dict:
    """Run ``trtexec`` (must be on ``PATH``); return ``{"command", "bytes"}``.

    Raises :class:`ExportError` with the tail of its output if it fails or writes no plan.
    """
    cmd = trtexec_command(onnx_path, plan_path, max_length, fp16)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TRTEXEC_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ExportError(f"could not run {' '.join(cmd)}: {e}") from e
    if proc.returncode != 0 or not plan_path.is_file():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
        raise ExportError(f"trtexec failed (exit {proc.returncode}): {tail}")
    return {"command": cmd, "bytes": plan_path.stat().st_size}
