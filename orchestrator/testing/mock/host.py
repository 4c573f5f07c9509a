"""What the mock's parts need from the server they run in: :class:`Host`.

Loading, execution, the ``pb_utils`` stand-ins and the context all talk to this interface,
never to :class:`~orchestrator.testing.mock.server.MockTriton` itself, so the server module
is the only one that imports them all and no import circle forms (checked by
``tests/unit/test_layout.py``, type-only imports included).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, FrozenSet, Optional, Protocol, Union

from orchestrator.testing.mock.faults import FaultInjector
from orchestrator.testing.mock.metric_store import MetricRegistry
from orchestrator.testing.mock.records import Recorder

if TYPE_CHECKING:  # pragma: no cover
    from orchestrator.testing.mock.instances import LoadedModel


class Host(Protocol):
    """The server side of the mock, as its parts see it.

    ``recorder``: where calls, log records and model states go. ``faults``: injected
    failures and delays. ``metric_registry``: custom metric values. ``closed``: no more
    requests. The settings are those of :class:`~orchestrator.testing.mock.MockTriton`.
    """

    recorder: Recorder
    faults: FaultInjector
    metric_registry: MetricRegistry
    model_repository: Path
    model_config_name: Optional[str]
    auto_complete: bool
    strict_outputs: bool
    instance_wait_timeout: float
    response_timeout: float
    release: str
    features: FrozenSet[str]

    @property
    def closed(self) -> bool: ...

    def loaded(self, name: str, version: Union[int, str] = -1) -> Optional["LoadedModel"]:
        """The READY model ``name`` in ``version`` (-1 or "": the highest), else None."""

    def load(self, name: str, config: Optional[str] = None) -> None: ...

    def unload(self, name: str, unload_dependents: bool = False) -> None: ...

    def is_model_ready(self, name: str, version: Union[str, int] = "") -> bool: ...

    def bls_exec(self, request: Any, decoupled: bool = False) -> Any:
        """``InferenceRequest.exec(decoupled)``: the ``InferenceResponse`` (errors
        included), or with ``decoupled`` a response iterator."""
