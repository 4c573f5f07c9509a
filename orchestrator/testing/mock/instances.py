"""A loaded model: its configuration, its one ``TritonPythonModel`` instance and the
event loop its ``async def execute`` runs on."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional


class Step(NamedTuple):
    """One ``ensemble_scheduling.step``."""

    model_name: str
    model_version: int
    input_map: Dict[str, str]  # composing-model input -> ensemble tensor
    output_map: Dict[str, str]  # composing-model output -> ensemble tensor


class LoadedModel:
    """One version of a model as the mock holds it.

    ``config`` is the normalized configuration dict (``args["model_config"]``);
    ``inputs``/``outputs`` map names to their config entries. ``lock`` is held while an
    ``execute`` runs (one instance = one batch at a time). ``initialized`` turns true
    after ``initialize``, ``finalizing`` while ``finalize`` runs, ``ready`` while the
    model takes requests.
    """

    def __init__(self, name: str, model_dir: Path, version: str, config: dict, config_path: Path):
        self.name = name
        self.model_dir = model_dir
        self.version = version
        self.version_dir: Optional[Path] = model_dir / version
        self.config = config
        self.config_json = json.dumps(config)
        self.config_path = config_path
        self.is_ensemble = config.get("platform") == "ensemble"
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs: Dict[str, dict] = {i["name"]: i for i in config.get("input", [])}
        self.outputs: Dict[str, dict] = {o["name"]: o for o in config.get("output", [])}
        self.dynamic_batching = "dynamic_batching" in config
        # model_transaction_policy { decoupled: true }: responses go through the senders
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled"))
        self.has_optional_input = any(i.get("optional") for i in self.inputs.values())
        groups = config.get("instance_group") or []
        group = groups[0] if groups else {"name": name, "kind": "KIND_CPU", "gpus": []}
        self.instance_name = f"{group.get('name') or name}_0"
        self.instance_kind = "GPU" if group.get("kind") == "KIND_GPU" else "CPU"
        gpus = group.get("gpus") or []
        self.device_id = str(gpus[0]) if (self.instance_kind == "GPU" and gpus) else "0"
        self.model_py: Optional[Path] = None
        self.module_prefix: Optional[str] = None
        self.instance: Any = None
        self.steps: List[Step] = []
        self.lock = threading.RLock()
        # requests waiting for the instance (the queue that max_queue_size bounds)
        self.queued = 0
        self.queue_lock = threading.Lock()
        self.initialized = False
        self.finalizing = False
        self.ready = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._loop_lock = threading.Lock()

    def initialize_args(self) -> Dict[str, str]:
        """The ``args`` dict the stub passes to ``initialize``."""
        return {
            "model_config": self.config_json,
            "model_instance_kind": self.instance_kind,
            "model_instance_name": self.instance_name,
            "model_instance_device_id": self.device_id,
            "model_repository": str(self.model_dir),
            "model_version": self.version,
            "model_name": self.name,
        }

    def loop(self) -> asyncio.AbstractEventLoop:
        """The model's event loop, running in a daemon thread (started on first use)."""
        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"mock-triton-{self.name}-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def stop_loop(self) -> None:
        """Stop and close the event loop (waits up to 10 s for its thread)."""
        with self._loop_lock:
            loop, thread = self._loop, self._loop_thread
            self._loop = self._loop_thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is thread:
            return  # unloading from inside its own loop: let it wind down
        thread.join(timeout=10)
        if not thread.is_alive():
            try:
                loop.run_until_complete(loop.shutdown_default_executor())
            except Exception:  # pragma: no cover - best effort
                pass
            loop.close()
