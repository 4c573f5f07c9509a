"""Loading and finalizing models as the Python backend's stub does (r24.10).

A Python model's ``model.py`` is imported under a unique module name
(``_mock_triton_models.<model>_v<version>_<random>.model``) with its version directory
as the package path, ``auto_complete_config`` is applied when the class defines it, and
``initialize(args)`` gets the stub's ``args``. Every version the ``version_policy`` names
is loaded. Top-level modules a model imports from its own directories (``import helper``
for ``1/helper.py``) are its own, as in the stub's separate process: they are taken out
of ``sys.modules`` after the import, so another model's ``helper`` is never reused. Ensembles are checked and ordered by
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
from typing import TYPE_CHECKING, Any, List, Optional, Set

from orchestrator.testing.mock import pb_helpers
from orchestrator.testing.mock.config import from_dict, normalize, pick_versions, read, to_dict, validate_io
from orchestrator.testing.mock.context import CTX, Ctx, running
from orchestrator.testing.mock.ensemble import load_ensemble
from orchestrator.testing.mock.errors import LoadError, format_exception
from orchestrator.testing.mock.instances import LoadedModel
from orchestrator.testing.mock.logger import LOGGER_NAME
from orchestrator.testing.mock.records import LogRecord

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.host import Host

_LOG = logging.getLogger(LOGGER_NAME)
_MODULE_ROOT = "_mock_triton_models"


def build(server: "Host", name: str, override: Optional[str]) -> List[LoadedModel]:
    """Read the configuration of ``name`` and load each version its ``version_policy``
    names (initialized, not yet ready), lowest version first.

    ``override``: a JSON configuration replacing the file. Raises :class:`LoadError`
    (after finalizing the versions already loaded): backends other than ``python`` (and
    ensembles) are refused.
    """
    model_dir = server.model_repository / name
    proto, path = read(name, model_dir, server.model_config_name, override, server.auto_complete)
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
    versions = pick_versions(name, model_dir, data)
    server.recorder.set_state(name, "LOADING", "", versions[-1])
    if proto.platform == "ensemble":
        model = LoadedModel(name, model_dir, versions[-1], data, path)
        return [load_ensemble(model, lambda step_model: _load_composing(server, step_model))]
    loaded: List[LoadedModel] = []
    try:
        for version in versions:
            loaded.append(_load_python(server, LoadedModel(name, model_dir, version, data, path)))
    except LoadError:
        for model in loaded:
            finalize(server, model)
        raise
    return loaded


def _load_composing(server: "Host", name: str) -> LoadedModel:
    server.load(name)
    model = server.loaded(name)
    assert model is not None
    return model


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
    local = _local_names(model)
    others = {k: sys.modules.pop(k) for k in list(sys.modules) if k.partition(".")[0] in local}
    before = set(sys.modules)
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
        for key in set(sys.modules) - before:
            if key.partition(".")[0] in local:
                del sys.modules[key]  # the model's module keeps its own reference
        for key, other in others.items():
            sys.modules.setdefault(key, other)
    return module


def _local_names(model: LoadedModel) -> Set[str]:
    """Top-level module names ``model.py`` can import from its version and model
    directories (Triton puts both on ``sys.path``)."""
    names: Set[str] = set()
    for directory in (model.version_dir, model.model_dir):
        if directory is None or not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if entry.suffix == ".py" or (entry.is_dir() and entry.name.isidentifier()):
                names.add(entry.stem if entry.suffix == ".py" else entry.name)
    return names


def _drop_modules(model: LoadedModel) -> None:
    prefix = model.module_prefix
    if not prefix:
        return
    for key in [k for k in sys.modules if k == prefix or k.startswith(prefix + ".")]:
        del sys.modules[key]
    model.module_prefix = None


def _auto_complete(model: LoadedModel, cls: Any) -> LoadedModel:
    """``model`` with the configuration ``cls.auto_complete_config`` returns."""
    completed = cls.auto_complete_config(pb_helpers.ModelConfig(json.dumps(model.config)))
    if not isinstance(completed, pb_helpers.ModelConfig):
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


def _load_python(server: "Host", model: LoadedModel) -> LoadedModel:
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
            reason = f"Internal: {format_exception(exc)}"
            raise LoadError(
                f"load failed for model '{name}': version {version} is at UNAVAILABLE state: "
                f"{reason};\n",
                reason,
            ) from exc
    finally:
        CTX.reset(token)


def finalize(server: "Host", model: LoadedModel) -> None:
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
                server.recorder.log(
                    LogRecord(model.name, "ERROR", f"finalize failed: {type(exc).__name__}: {exc}")
                )
    model.stop_loop()
    _drop_modules(model)
    model.instance = None
