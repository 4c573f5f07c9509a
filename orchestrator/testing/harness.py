"""What the pytest plugin hands a test: a :class:`~orchestrator.testing.mock.MockTriton`
over a writable overlay of a model repository, to which a test adds models and inline fakes.

The overlay is a temporary directory with one entry per model of the user's repository
(a symbolic link, or a copy where links cannot be made), so the user's directory is never
written; :meth:`TritonMock.add_model` and :meth:`TritonMock.fake` write their models into
the overlay only, a fake replacing the user's model of that name.
"""

from __future__ import annotations

import inspect
import itertools
import os
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from orchestrator.testing.mock import MockTriton

#: A tensor declared for a fake: a KServe datatype (``"FP32"``, ``"BYTES"`` ...; dims
#: ``[-1]``) or ``(datatype, dims)``.
TensorSpec = Union[str, Tuple[str, Sequence[int]]]

_FAKES: Dict[str, Any] = {}
_FAKES_LOCK = threading.Lock()
_IDS = itertools.count(1)

_PROTOCOL_TO_CONFIG = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}

_FAKE_MODEL_PY = '''\
# A fake model the test defined inline (orchestrator.testing.harness); not a real model.
from orchestrator.testing.harness import fake_model_class

TritonPythonModel = fake_model_class({key!r})
'''


def _tensor_config(kind: str, name: str, spec: TensorSpec) -> str:
    datatype, dims = (spec, [-1]) if isinstance(spec, str) else (spec[0], list(spec[1]))
    config_type = _PROTOCOL_TO_CONFIG.get(datatype.upper().replace("TYPE_", "").replace("STRING", "BYTES"))
    if config_type is None:
        raise ValueError(f"{kind} '{name}': unknown datatype {datatype!r}; use one of {sorted(_PROTOCOL_TO_CONFIG)}")
    dims_text = ", ".join(str(int(d)) for d in dims)
    return f'{kind} {{ name: "{name}" data_type: {config_type} dims: [ {dims_text} ] }}'


def fake_config(name: str, inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec],
                max_batch_size: int = 0, decoupled: bool = False) -> str:
    """The ``config.pbtxt`` of a fake model: the Python backend, one CPU instance, every input
    optional (a fake answers whatever its caller sends), ``outputs`` as declared."""
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {int(max_batch_size)}"]
    for input_name, spec in inputs.items():
        lines.append(_tensor_config("input", input_name, spec)[:-1] + "optional: true }")
    lines += [_tensor_config("output", output_name, spec) for output_name, spec in outputs.items()]
    lines.append("instance_group { kind: KIND_CPU count: 1 }")
    if decoupled:
        lines.append("model_transaction_policy { decoupled: true }")
    return "\n".join(lines) + "\n"


def _takes_parameters(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def fake_model_class(key: str) -> Any:
    """The ``TritonPythonModel`` class of the fake registered under ``key`` (the fake's own
    class when the test gave a class, else a wrapper of its function)."""
    with _FAKES_LOCK:
        target = _FAKES[key]
    if inspect.isclass(target):
        return target
    return _function_model(target)


def _function_model(fn: Callable[..., Any]) -> Any:
    import json

    import triton_python_backend_utils as pb_utils

    with_parameters = _takes_parameters(fn)
    generator = inspect.isgeneratorfunction(fn)

    def call(request: Any) -> Any:
        inputs = {t.name(): t.as_numpy() for t in request.inputs()}
        if with_parameters:
            return fn(inputs, json.loads(request.parameters() or "{}"))
        return fn(inputs)

    def response(outputs: Mapping[str, Any]) -> Any:
        return pb_utils.InferenceResponse([pb_utils.Tensor(k, np.asarray(v)) for k, v in outputs.items()])

    class FakeModel:
        def execute(self, requests: Sequence[Any]) -> Any:
            if generator:
                for request in requests:
                    sender = request.get_response_sender()
                    try:
                        for outputs in call(request):
                            sender.send(response(outputs))
                    except Exception as exc:  # an error response, as a model would send it
                        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
            responses = []
            for request in requests:
                try:
                    responses.append(response(call(request)))
                except Exception as exc:
                    responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
            return responses

    FakeModel.__name__ = FakeModel.__qualname__ = f"Fake_{getattr(fn, '__name__', 'model')}"
    return FakeModel


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.symlink(source, target, target_is_directory=source.is_dir())
    except (OSError, NotImplementedError):  # no symlinks (e.g. Windows without the privilege)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)


class TritonMock(MockTriton):
    """A :class:`~orchestrator.testing.mock.MockTriton` over a writable overlay of
    ``source`` (the user's model repository, or None for an empty one) in ``workdir``.

    Everything of :class:`MockTriton` (``load``, ``unload``, ``infer``, ``infer_stream``,
    ``fail_next``, ``set_delay``, ``kill_stub``, ``calls``, ``logs``, ``metrics()``,
    ``traces`` ...), plus :meth:`add_model` and :meth:`fake`. ``model_repository`` is the
    overlay; ``source`` the user's directory.
    """

    def __init__(self, source: Optional[Union[str, "os.PathLike[str]"]], workdir: Union[str, "os.PathLike[str]"],
                 *, load: Iterable[str] = (), **kwargs: Any) -> None:
        overlay = Path(workdir)
        overlay.mkdir(parents=True, exist_ok=True)
        self.source = Path(source).resolve() if source is not None else None
        if self.source is not None:
            if not self.source.is_dir():
                raise FileNotFoundError(f"model repository not found: {self.source}")
            for entry in sorted(self.source.iterdir()):
                _link_or_copy(entry, overlay / entry.name)
        self._fake_keys: List[str] = []
        kwargs.setdefault("model_config_name", None)
        super().__init__(overlay, models=load, **kwargs)

    def _replace_dir(self, name: str) -> Path:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise ValueError(f"invalid model name {name!r}")
        self.unload(name)
        target = self.model_repository / name
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        return target

    def add_model(self, name: str, config: str, model_py: Optional[str] = None, *,
                  version: int = 1, files: Optional[Mapping[str, Union[str, bytes]]] = None,
                  load: bool = True) -> Path:
        """Write model ``name`` into the overlay (replacing one of that name) and load it.

        ``config``: the ``config.pbtxt`` text. ``model_py``: the source of
        ``<version>/model.py`` (a Python model). ``files``: more files, path relative to the
        model directory -> text or bytes. ``load=False`` leaves it unloaded. Returns the
        model's directory. Raises :class:`~orchestrator.testing.mock.LoadError` when the load
        fails.
        """
        target = self._replace_dir(name)
        (target / str(version)).mkdir(parents=True)
        (target / "config.pbtxt").write_text(config, encoding="utf-8")
        if model_py is not None:
            (target / str(version) / "model.py").write_text(model_py, encoding="utf-8")
        for relative, content in (files or {}).items():
            path = target / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-8")
        if load:
            self.load(name)
        return target

    def fake(self, name: str, model: Any, *, inputs: Optional[Mapping[str, TensorSpec]] = None,
             outputs: Optional[Mapping[str, TensorSpec]] = None, max_batch_size: int = 0,
             config: Optional[str] = None) -> None:
        """Stand in a fake for model ``name`` (replacing the repository's, in the overlay
        only) and load it, so BLS calls and ensemble steps to ``name`` reach it.

        ``model``: a function ``f(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]``
        (or ``f(inputs, parameters: dict)``), called once per request; an exception it
        raises becomes that request's error response (``TritonError(str(exc))``). A
        generator function makes a decoupled model: each yielded dict is one response, then
        the final flag. A class is used as the model's ``TritonPythonModel`` itself (full
        ``pb_utils`` API). ``inputs``/``outputs``: name -> datatype (``"FP32"``, ``"BYTES"``
        ..., dims ``[-1]``) or ``(datatype, dims)``; every input is optional. ``config``:
        a whole ``config.pbtxt`` instead. Calls are recorded like any model's
        (``calls_to(name)``).
        """
        if config is None and not outputs:
            raise ValueError(f"fake '{name}': declare its outputs (outputs={{'NAME': 'FP32'}}) or give config=")
        key = f"fake-{next(_IDS)}-{name}"
        with _FAKES_LOCK:
            _FAKES[key] = model
        self._fake_keys.append(key)
        decoupled = inspect.isgeneratorfunction(model)
        text = config if config is not None else fake_config(name, inputs or {}, outputs or {}, max_batch_size, decoupled)
        self.add_model(name, text, _FAKE_MODEL_PY.format(key=key))

    def close(self) -> None:
        try:
            super().close()
        finally:
            with _FAKES_LOCK:
                for key in self._fake_keys:
                    _FAKES.pop(key, None)
            self._fake_keys.clear()
