"""Loading and finalizing models as the Python backend's stub does (r24.10).

A Python model's ``model.py`` is imported under a unique module name
(``_mock_triton_models.<model>_v<version>_<random>.model``) with its version directory
as the package path, ``auto_complete_config`` is applied when the class defines it, and
``initialize(args)`` gets the stub's ``args``. Ensembles are checked and ordered by
:mod:`orchestrator.testing.mock.ensemble`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import re
import sys
import types
import uuid
import warnings
from typing import TYPE_CHECKING, Any, Optional

from orchestrator.testing.mock.config import from_dict, normalize, pick_version, read, to_dict, validate_io
from orchestrator.testing.mock.context import CTX, Ctx, running
from orchestrator.testing.mock.ensemble import load_ensemble
from orchestrator.testing.mock.errors import LoadError
from orchestrator.testing.mock.instances import LoadedModel
from orchestrator.testing.mock.logger import LOGGER_NAME, LogRecord
from orchestrator.testing.mock.wire import real_utils

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.server import MockTriton

_LOG = logging.getLogger(LOGGER_NAME)
_MODULE_ROOT = "_mock_triton_models"


def build(server: "MockTriton", name: str, override: Optional[str]) -> LoadedModel:
    """Read the configuration of ``name`` and load it (initialized, not yet ready).

    ``override``: a JSON configuration replacing the file. Raises :class:`LoadError`:
    decoupled models and backends other than ``python`` (and ensembles) are refused.
    """
    model_dir = server.model_repository / name
    proto, path = read(name, model_dir, server.model_config_name, override)
    if proto.model_transaction_policy.decoupled:
        raise LoadError(f"failed to load '{name}': decoupled models are not supported by the mock")
    if proto.platform != "ensemble" and proto.backend != "python":
        what = proto.platform or proto.backend or "no backend/platform"
        raise LoadError(
            f"failed to load '{name}': the mock only runs Python-backend models "
            f"(backend: \"python\") and ensembles; {path} uses {what!r}. (Use a "
            "configuration that runs the model with the Python backend, e.g. "
            "model_config_name='embedded' for this repository's classifiers.)"
        )
    normalize(proto)
    data = to_dict(proto)
    version = pick_version(name, model_dir, data)
    server._set_state(name, "LOADING", "", version)
    model = LoadedModel(name, model_dir, version, data, path)
    if proto.platform == "ensemble":
        return load_ensemble(model, lambda step_model: _load_composing(server, step_model))
    return _load_python(server, model)


def _load_composing(server: "MockTriton", name: str) -> LoadedModel:
    server.load(name)
    return server._models[name]


def _import_model(model: LoadedModel) -> types.ModuleType:
    assert model.version_dir is not None
    filename = model.config.get("default_model_filename") or "model.py"
    py_file = model.version_dir / filename
    if not py_file.is_file():
        raise LoadError(
            f"failed to load '{model.name}' version {model.version}: Python model file not "
            f"found in '{py_file}'"
        )
    model.model_py = py_file
    if _MODULE_ROOT not in sys.modules:
        root_pkg = types.ModuleType(_MODULE_ROOT)
        root_pkg.__path__ = []  # type: ignore[attr-defined]
        sys.modules[_MODULE_ROOT] = root_pkg
    safe = re.sub(r"\W", "_", model.name)
    prefix = f"{_MODULE_ROOT}.{safe}_v{model.version}_{uuid.uuid4().hex[:8]}"
    package = types.ModuleType(prefix)
    package.__path__ = [str(model.version_dir)]  # type: ignore[attr-defined]
    package.__package__ = prefix
    sys.modules[prefix] = package
    model.module_prefix = prefix
    module_name = f"{prefix}.{py_file.stem}"
    spec = importlib.util.spec_from_file_location(module_name, py_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    added = []
    dont_write_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # as the stub does; keeps model repositories clean
    for entry in (str(model.version_dir), str(model.model_dir)):
        if entry not in sys.path:
            sys.path.append(entry)
            added.append(entry)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write_bytecode
        for entry in added:
            try:
                sys.path.remove(entry)
            except ValueError:  # pragma: no cover
                pass
    return module


def _drop_modules(model: LoadedModel) -> None:
    prefix = model.module_prefix
    if not prefix:
        return
    for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
        del sys.modules[key]
    model.module_prefix = None


def _auto_complete(model: LoadedModel, cls: Any) -> LoadedModel:
    """``model`` with the configuration ``cls.auto_complete_config`` returns."""
    pb = real_utils()
    completed = cls.auto_complete_config(pb.ModelConfig(json.dumps(model.config)))
    if not isinstance(completed, pb.ModelConfig):
        raise LoadError(
            f"auto_complete_config function in model '{model.name}' must return a "
            "valid pb.ModelConfig object."
        )
    proto = from_dict(completed.as_dict())
    normalize(proto)
    data = to_dict(proto)
    new = LoadedModel(model.name, model.model_dir, model.version, data, model.config_path)
    new.module_prefix, new.model_py = model.module_prefix, model.model_py
    return new


def _load_python(server: "MockTriton", model: LoadedModel) -> LoadedModel:
    name, version = model.name, model.version
    token = CTX.set(Ctx(server, model))
    try:
        try:
            module = _import_model(model)
            cls = getattr(module, "TritonPythonModel", None)
            if cls is None:
                raise AttributeError(f"{model.model_py} does not define TritonPythonModel")
            if server.auto_complete and hasattr(cls, "auto_complete_config"):
                model = _auto_complete(model, cls)
                CTX.set(Ctx(server, model))
            validate_io(name, model.config)
            model.instance = cls()
            if hasattr(model.instance, "initialize"):
                result = model.instance.initialize(model.initialize_args())
                if asyncio.iscoroutine(result):
                    # The r24.10 stub calls initialize() without awaiting it.
                    result.close()
                    warnings.warn(
                        f"model '{name}': async initialize() is not awaited by Triton's "
                        "Python backend (r24.10); its body never runs",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            model.initialized = True
            return model
        except LoadError:
            _drop_modules(model)
            raise
        except Exception as exc:
            _drop_modules(model)
            model.stop_loop()
            raise LoadError(
                f"failed to load '{name}' version {version}: {type(exc).__name__}: {exc}"
            ) from exc
    finally:
        CTX.reset(token)


def finalize(server: "MockTriton", model: LoadedModel) -> None:
    """Call ``finalize`` (errors are logged, as Triton does), stop the model's event
    loop and drop its modules. The caller holds ``model.lock`` where it could."""
    if model.instance is not None and hasattr(model.instance, "finalize"):
        model.finalizing = True
        with running(server, model):
            try:
                result = model.instance.finalize()
                if asyncio.iscoroutine(result):
                    result.close()
            except Exception as exc:  # Triton logs finalize errors and goes on
                _LOG.error("model '%s' finalize failed: %s", model.name, exc)
                server._record_log(
                    LogRecord(model.name, "ERROR", f"finalize failed: {type(exc).__name__}: {exc}")
                )
    model.stop_loop()
    _drop_modules(model)
    model.instance = None
