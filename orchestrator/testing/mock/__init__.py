"""In-process mock of Triton's Python backend and a mini "server" for unit tests.

The mock runs the *real* ``model.py`` files of a model repository in the test process,
so Python-backend models (including a BLS router that calls other models) can be
tested in milliseconds, without a ``tritonserver``. It has two parts:

* a stand-in for the ``triton_python_backend_utils`` module (``pb_utils``), installed in
  ``sys.modules`` by :func:`install`. Its pure-Python helpers (``get_input_tensor_by_name``,
  ``triton_string_to_numpy``, ``serialize_byte_tensor``, ``ModelConfig`` ...) are loaded at
  run time from the real file shipped in the ``nvidia-pytriton`` wheel
  (``pytriton/tritonserver/backends/python/triton_python_backend_utils.py``, Triton 2.51 /
  r24.10; set ``MOCK_TRITON_PB_UTILS`` to use another copy). The parts that are C++ in the
  real stub (``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError``,
  ``TritonModelException``, ``Logger``, ``MetricFamily``, ``load_model``,
  ``unload_model``, ``is_model_ready``, ``get_model_dir``, ``PreferredMemory``,
  ``TRITONSERVER_MEMORY_CPU/GPU``) are re-implemented here after the r24.10 sources
  (python_backend ``pb_stub.cc``, ``infer_request.cc``, ``request_executor.cc``; core
  ``infer_request.cc``). Only the names the real module exposes are exposed.
* :class:`MockTriton`, a mini server with explicit model control: it parses the model
  configurations (with Triton's ``model_config.proto``, through
  :mod:`orchestrator.tooling.repository`), imports each Python model, calls
  ``initialize``/``execute``/``finalize`` as the stub does, validates requests the way
  Triton's core does, runs ensembles, and records what happened (``calls``, ``logs``,
  ``metrics()``).

Usage::

    from orchestrator.testing.mock import MockTriton, InferError

    with MockTriton("model_repository") as mock:            # model_config_name="embedded"
        mock.load("router")                                  # explicit model control
        out = mock.infer("router", {"TEXT": np.array([[b"hi"]], dtype=object),
                                    "THRESHOLD": np.array([[0.5]], dtype=np.float32)})
        assert mock.calls_to("tokenizer") == [(1,)]          # one BLS call, batch of 1

API summary (see the docstrings)::

    install() -> module                   # idempotent; MockTriton() calls it
    class InferError(Exception): message: str; code: str    # an error *response*
    class LoadError(RuntimeError)                            # a model failed to load
    class MockTriton:
        __init__(model_repository, model_config_name="embedded", *, models=(),
                 strict_outputs=True, auto_complete=True, instance_wait_timeout=120.0)
        load(name, config=None); unload(name, unload_dependents=False); close()
        infer(model, inputs, parameters=None, request_id="", *, outputs=None) -> dict
        infer_batch(model, requests) -> list[dict | InferError]
        is_model_ready(name, version=""); repository_index(); model_config(name); instance(name)
        calls: list[Call]; calls_to(model); reset_calls()
        fail_next(model, message, count=1, code="INTERNAL"); set_failure(model, failure)
        set_delay(model, seconds); clear_faults(model=None)
        metrics() -> {family: {frozenset(labels.items()): value}}; metric(family, labels)
        logs: list[LogRecord]
    class Call(NamedTuple): model: str; batch_sizes: tuple; requests -> int
    class LogRecord(NamedTuple): model: str | None; level: str; message: str
    # the pb_utils stand-ins, also importable from here:
    Tensor, InferenceRequest, InferenceResponse, TritonError, TritonModelException,
    Logger, MetricFamily

Model code's ``pb_utils.Logger`` messages also go to the ``logging`` logger
``orchestrator.testing.mock.<model>`` (``.stub`` outside models).

Modules, by concern::

    wire        datatype tables, BYTES (de)serialization, Triton's own pb_utils file
    errors      TritonModelException, TritonError, InferError, LoadError
    tensors     pb_utils.Tensor, PreferredMemory
    requests    pb_utils.InferenceRequest/InferenceResponse, the response sender
    logger      pb_utils.Logger, LogRecord
    metrics     pb_utils.MetricFamily and the per-server registry
    pb_utils    load_model/unload_model/is_model_ready/get_model_dir, install()
    context     which server/model the running code belongs to
    config      reading (tooling.repository), normalizing, checking configurations
    instances   a loaded model, its instance and event loop
    loading     importing model.py, auto_complete_config, initialize/finalize
    ensemble    ensemble checks at load time and the step-by-step run
    records     requests as the server holds them, results, Call
    client      numpy inputs as tritonclient would send them
    validation  the core's request checks (InferenceRequest::Normalize)
    execution   batching rules, execute as the stub calls it, output checks
    faults      fail_next/set_failure/set_delay
    server      MockTriton

Where the mock differs from a real Triton 2.51 server (a mock must say where it is not
honest):

* One process, one instance. Every model gets a single ``TritonPythonModel`` instance
  (``instance_group.count`` is ignored), all models share this interpreter's
  ``sys.modules`` and globals (Triton gives every instance its own stub process), and
  ``model.py`` is imported under a unique module name (``_mock_triton_models.<...>.model``)
  with its version directory as package path, so ``from . import x`` works. Triton appends
  ``<model>/1`` and ``<model>`` to ``sys.path`` for good; the mock does so only while
  ``model.py`` is imported. ``args["model_instance_kind"]`` is taken from the config
  (``KIND_GPU`` -> ``"GPU"``); nothing checks that a GPU exists.
* Executes of one model are serialized (one instance = one batch at a time). Requests
  sent concurrently (e.g. two ``async_exec`` to the same model under ``asyncio.gather``)
  are *not* merged into one batch as Triton's dynamic batcher might; each gets its own
  ``execute``. Only :meth:`MockTriton.infer_batch` forms batches, with the batcher's
  rules (see there). ``preferred_batch_size``, queue delays, priorities, request timeouts
  (``timeout=``) and cancellation are not modelled (``is_cancelled()`` is always False).
* ``async def execute`` runs on a per-model event loop in a daemon thread and the caller
  waits for it, as the r24.10 stub does (``run_coroutine_threadsafe(...).result()``);
  ``async_exec`` is ``loop.run_in_executor(None, exec)`` as in the stub. The stub also
  makes that loop the main thread's current loop (``asyncio.set_event_loop``); the mock
  does not touch the caller's thread.
* Ensembles run their steps one after the other in dependency order (Triton may run
  independent steps concurrently); each request of an ``infer_batch`` to an ensemble goes
  through the pipeline on its own. Request parameters and ids are forwarded to the
  composing models, as in Triton.
* Output checks (``strict_outputs=True``, the default) are *stricter* than Triton: a
  returned output that is not in the model configuration, whose datatype differs from
  the configuration, or whose shape does not fit ``[batch] + dims`` fails that request
  with a message that says it is a mock-only check. Real Triton 24.10 silently drops
  outputs that were not requested (an unknown name is never requested) and passes any
  datatype/shape through to the client. ``strict_outputs=False`` mirrors Triton exactly.
* Error *texts* follow the r24.10 sources (core ``Normalize()``, stub ``ProcessRequests``,
  BLS ``RequestExecutor``); the Python traceback part of "Failed to process the
  request(s) ..." messages is an approximation of pybind11's ``At:`` frame list.
  Error codes of client-side errors follow the core; BLS error responses carry
  ``TritonError.INTERNAL`` as in r24.10 (the stub keeps only the message).
* Client side: :meth:`MockTriton.infer` takes numpy arrays, as ``tritonclient``'s
  ``set_data_from_numpy`` does, with the datatype taken from the array (float64 stays
  FP64, so a FP32 input fails server-side like it would with a real client). Object
  arrays of ``str`` are encoded to UTF-8 ``bytes`` like the client's
  ``serialize_byte_tensor``; numpy unicode arrays (``dtype '<U..'``) are refused, as the
  real client refuses them. Output BYTES tensors come back as object arrays of ``bytes``.
* Load/unload are synchronous. Loading an already-READY model without a config override
  is a no-op (Triton skips unmodified models); with ``config=`` it reloads. Decoupled
  models and ``load_model(files=...)`` are not supported. ``auto_complete_config`` is
  called when the class defines it (Triton's default, auto-complete enabled).
* Metrics live in the :class:`MockTriton`, not in a Prometheus endpoint. As in Triton a
  metric series disappears when the last ``Metric`` object for it is garbage-collected
  (or its model is unloaded), so read ``metrics()`` before ``close()``.
* Input validation mirrors the core exactly, including its gap: with ``optional`` inputs
  only the *number* of inputs is checked, so a request that omits a required input but
  sends an optional one reaches ``execute`` (in Triton too).
* A synchronous model that BLS-calls itself re-enters its own instance in the mock (Triton
  would wait for the busy instance); an asynchronous one fails after
  ``instance_wait_timeout``. ``InferenceRequest.exec()`` also works from test code outside
  any model (it uses the most recent open MockTriton); the real stub has no such case.
* ``pb_utils.InferenceRequest(parameters=...)`` takes a ``dict`` only, as in r24.10; a
  JSON string raises ``TritonModelException`` there and here.
* Responses sent through ``request.get_response_sender()`` in a non-decoupled model are
  delivered when ``execute`` returns, not immediately. A request that gets no response at
  all fails with an error instead of hanging as it would in Triton.
* GPU tensors, DLPack GPU exchange, BF16, shape tensors, request rescheduling,
  sequence batching state and model warmup are not supported.
"""

from orchestrator.testing.mock.errors import InferError, LoadError, TritonError, TritonModelException
from orchestrator.testing.mock.logger import Logger
from orchestrator.testing.mock.metrics import MetricFamily
from orchestrator.testing.mock.pb_utils import install
from orchestrator.testing.mock.records import Call, LogRecord
from orchestrator.testing.mock.requests import InferenceRequest, InferenceResponse
from orchestrator.testing.mock.server import MockTriton
from orchestrator.testing.mock.tensors import Tensor

__all__ = [
    "install",
    "MockTriton",
    "InferError",
    "LoadError",
    "Call",
    "LogRecord",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "Logger",
    "MetricFamily",
]
