"""In-process mock of Triton's Python backend and a mini "server" for unit tests.

The mock runs the *real* ``model.py`` files of a model repository in the test process,
so Python-backend models (including a BLS router that calls other models) can be
tested in milliseconds, without a ``tritonserver``. It has two parts:

* a stand-in for the ``triton_python_backend_utils`` module (``pb_utils``), installed in
  ``sys.modules`` by :func:`install`. Its pure-Python helpers (``get_input_tensor_by_name``,
  ``triton_string_to_numpy``, ``serialize_byte_tensor``, ``ModelConfig`` ...) are the
  mock's own (:mod:`~orchestrator.testing.mock.pb_helpers`), checked against Triton 2.51's
  (r24.10) file where that is installed; the mock needs no Triton wheel and nothing
  Linux-only (numpy, protobuf, PyYAML). The parts that are C++ in the
  real stub (``Tensor``, ``InferenceRequest``, ``InferenceResponse``, ``TritonError``,
  ``TritonModelException``, ``Logger``, ``MetricFamily``, ``load_model``,
  ``unload_model``, ``is_model_ready``, ``get_model_dir``, ``PreferredMemory``,
  ``TRITONSERVER_MEMORY_CPU/GPU``) are re-implemented here after the r24.10 sources
  (python_backend ``pb_stub.cc``, ``infer_request.cc``, ``request_executor.cc``; core
  ``infer_request.cc``). Only the names the real module exposes are exposed.
* :class:`MockTriton`, a mini server with explicit model control: it parses the model
  configurations (``model_config.proto``'s layout, declared in
  :mod:`~orchestrator.testing.mock.model_config`, and protobuf ``text_format``; the mock
  imports nothing from the tooling or tritonclient), imports each Python model, calls
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

In pytest, the ``triton_mock`` fixture of :mod:`orchestrator.testing.pytest_plugin` (the
``testing`` extra) gives a test one of these over its repository, with inline fakes.

API summary (see the docstrings)::

    install() -> module                   # idempotent; MockTriton() calls it
    class InferError(Exception): message: str; code: str    # an error *response*
    class LoadError(RuntimeError)                            # a model failed to load
    class MockTriton:
        __init__(model_repository, model_config_name="embedded", *, models=(),
                 strict_outputs=True, auto_complete=True, instance_wait_timeout=120.0,
                 log_verbose=0, response_timeout=5.0, trace_rate=0, trace_mode="triton",
                 release=None)                       # "24.10"/"2.51" (default) or "26.08"
        load(name, config=None); unload(name, unload_dependents=False); close()
        infer(model, inputs, parameters=None, request_id="", *, outputs=None,
              model_version="") -> dict
        infer_response(...same...) -> (dict, response parameters dict)
        infer_batch(model, requests) -> list[dict | InferError]
        infer_stream(model, inputs, parameters=None, request_id="", *, outputs=None,
                     model_version="") -> list[StreamResponse]
        is_model_ready(name, version=""); repository_index(); model_config(name)
        instance(name, version=-1)
        calls: list[Call]; calls_to(model); reset_calls()
        fail_next(model, message, count=1, code="INTERNAL"); set_failure(model, failure)
        set_delay(model, seconds); kill_stub(model); clear_faults(model=None)
        metrics() -> {family: {frozenset(labels.items()): value}}; metric(family, labels)
        metrics_text() -> str                 # the models' families as /metrics shows them
        logs: list[LogRecord]; traces: list[TraceRecord]
    class Call(NamedTuple): model: str; batch_sizes: tuple; requests -> int
    class StreamResponse(NamedTuple): outputs: dict | None; error: InferError | None; final: bool
    class TraceRecord(NamedTuple): id: int; parent_id: int; model: str; request_id: str
    class LogRecord(NamedTuple): model: str | None; level: str; message: str
    # the pb_utils stand-ins, also importable from here:
    Tensor, InferenceRequest, InferenceResponse, TritonError, TritonModelException,
    Logger, MetricFamily

Model code's ``pb_utils.Logger`` messages also go to the ``logging`` logger
``orchestrator.testing.mock.<model>`` (``.stub`` outside models).

Modules, by concern::

    pb_helpers  pb_utils' pure-Python helpers (serialize_byte_tensor, ModelConfig, ...)
    model_config the ModelConfig protobuf message (model_config.proto's layout)
    wire        datatype tables, BYTES (de)serialization
    errors      TritonModelException, TritonError, InferError, LoadError, pybind-style errors
    tensors     pb_utils.Tensor (GPU outputs of BLS calls to KIND_GPU models), PreferredMemory
    releases    release profiles: which newer pb_utils features exist (MOCK_TRITON_RELEASE)
    requests    pb_utils.InferenceRequest/InferenceResponse, the response sender
    logger      pb_utils.Logger
    metrics     pb_utils.MetricFamily and its metrics
    metric_store the per-server metric registry and its snapshot
    pb_utils    load_model/unload_model/is_model_ready/get_model_dir, install()
    host        Host: the server as the other modules see it (no module imports server)
    context     which server/model the running code belongs to
    config      reading (model_config, protobuf text_format), normalizing, checking configurations
    instances   a loaded model, its instance and event loop
    loading     importing model.py, auto_complete_config, initialize/finalize
    ensemble    ensemble checks at load time and the step-by-step run
    records     requests as the server holds them, results, Call, LogRecord, Recorder
    client      numpy inputs as tritonclient would send them
    validation  the core's request checks (InferenceRequest::Normalize)
    execution   batching rules, execute as the stub calls it, output checks
    decoupled   decoupled models: response streams, execute as the stub runs it, BLS iterator
    faults      fail_next/set_failure/set_delay
    server      MockTriton

Where the mock differs from a real Triton 2.51 server (a mock must say where it is not
honest):

* One process, one instance. Every model version gets a single ``TritonPythonModel``
  instance (``instance_group.count`` is ignored). All models share this interpreter
  (Triton gives every instance its own stub process): third-party modules and their
  globals are shared. Modules a model imports from its own directories (``import helper``
  for ``1/helper.py``) are its own: they are taken out of ``sys.modules`` after
  ``model.py`` is imported, so another model's ``helper`` is never reused; one imported
  lazily inside ``execute`` is not found, because Triton appends ``<model>/<version>`` and
  ``<model>`` to ``sys.path`` for good and the mock only while ``model.py`` is imported.
  ``model.py`` is imported under a unique module name (``_mock_triton_models.<...>.model``)
  with its version directory as package path, so ``from . import x`` works. ``args["model_instance_kind"]`` is taken from the config
  (``KIND_GPU`` -> ``"GPU"``); nothing checks that a GPU exists. A
  ``KIND_GPU`` model answers BLS calls in GPU memory unless the request asks for CPU memory
  (see :class:`MockTriton`).
* Executes of one model are serialized (one instance = one batch at a time). Requests
  sent concurrently (e.g. two ``async_exec`` to the same model under ``asyncio.gather``)
  are *not* merged into one batch as Triton's dynamic batcher might; each gets its own
  ``execute``. Only :meth:`MockTriton.infer_batch` forms batches, with the batcher's
  rules (see there). ``preferred_batch_size``, queue delays, priorities and cancellation
  are not modelled (``is_cancelled()`` is always False). A request's ``timeout`` is
  applied as core r24.10 applies it: only for a model whose
  ``dynamic_batching.default_queue_policy`` sets ``default_timeout_microseconds`` (the
  request's own counts with ``allow_timeout_override`` when shorter), only to the wait
  for the busy instance, and the request is refused with ``Request timeout expired``
  (UNAVAILABLE); ``MockTriton.infer`` sends no timeout.
  ``default_queue_policy.max_queue_size`` bounds the requests waiting for the instance
  (one queue; priority levels are not modelled): a request that finds it full is refused
  at once with ``[request id: <id>] Exceeds maximum queue size`` (UNAVAILABLE), as core
  r24.10's ``PolicyQueue::Enqueue``.
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
* Load/unload are synchronous. Every version the ``version_policy`` names is loaded and
  served (``latest`` n, ``all``, ``specific``; BLS ``model_version``,
  ``is_model_ready(name, "2")``, ``infer(model_version=...)``); when one version fails
  the mock fails the whole load (not compared with Triton). Loading an already-READY model without a config override is a no-op
  (Triton skips unmodified models); with ``config=`` it reloads. A failed load raises
  :class:`LoadError` worded as Triton's repository API answers (``load failed for model
  'm': version 1 is at UNAVAILABLE state: Internal: <error and At: frames>;``) and the
  index shows Triton's reason. ``pb_utils.load_model`` of a failing model raises
  ``TritonModelException("Failed to load model: Failed to process the request for model
  '<calling instance>', message: <load error>")``: in the real 2.51 stub an unreadable
  byte follows "message: ", and that failure brought the server down
  (``boost::interprocess::lock_exception``) in most of our runs, so the mock keeps the
  readable cause. ``load_model(files=...)`` is not supported.
  ``auto_complete_config`` is called when the class defines it (Triton's default,
  auto-complete enabled).
* Metrics live in the :class:`MockTriton`, not in a Prometheus endpoint. As in the stub,
  a ``MetricFamily`` object keeps the metrics it made: a series lives until that family
  object is deleted (or its model unloaded), and its metrics then raise
  ``TritonModelException`` (``... the corresponding 'MetricFamily' has been deleted``);
  read ``metrics()`` before ``close()``. A family name used again with the same kind
  shares the first family (its help text stays); with another kind it raises (in the
  real 2.51 server that refusal often crashed the server too; the mock only raises).
* Input validation mirrors the core exactly, including its gap: with ``optional`` inputs
  only the *number* of inputs is checked, so a request that omits a required input but
  sends an optional one reaches ``execute`` (in Triton too).
* A synchronous model that BLS-calls itself re-enters its own instance in the mock (Triton
  would wait for the busy instance); an asynchronous one fails after
  ``instance_wait_timeout``. ``InferenceRequest.exec()`` also works from test code outside
  any model (it uses the most recent open MockTriton); the real stub has no such case.
* ``pb_utils.InferenceRequest(parameters=...)`` takes a ``dict`` only, as in r24.10; a
  JSON string raises ``TritonModelException`` there and here. Arguments pybind11 refuses
  (``None``, a list for ``Tensor``'s array, an ``int`` version for ``is_model_ready``)
  raise ``TypeError`` whose first line is pybind's ("__init__(): incompatible constructor
  arguments. ..."); the lines after it (signature, arguments) are approximations.
  ``str`` arguments also take UTF-8 ``bytes`` (``model_name=b"m"``), as in the stub.
* ``pb_utils.Logger`` VERBOSE messages are dropped, as by a server at the default
  ``--log-verbose=0``; ``MockTriton(log_verbose=1)`` keeps them.
* A non-decoupled model's response sent through ``request.get_response_sender()``
  (execute returning None for its request) reaches ``infer`` when the final flag comes:
  with the response, sent alone, or from another thread up to ``response_timeout``
  seconds later; ``infer_stream`` shows it with ``final`` False when the flag came alone,
  and nothing after it; a BLS caller gets it as soon as it is sent. A response sent with
  the flag before ``execute`` raised answers its request (the others get the error); one
  sent without the flag is followed by the error as a second response, and ``infer``
  then raises the frontends' ``expected a single response, got 2``, as in Triton 2.51. A
  request that gets no final flag fails with an error after ``response_timeout`` instead
  of hanging as it would in Triton.
* ``Tensor.from_dlpack`` makes a tensor whose ``as_numpy()`` is a writable view of the
  producer's memory and refuses strides the stub refuses ("DLPack tensor is not
  contiguous ..."; like the stub, only dimensions after the first are checked, but where
  the stub would then read the memory as if contiguous the mock copies it correctly).
  In the real 2.51 stub with numpy 1.x, ``from_dlpack`` of a *numpy array* (and so
  ``to_dlpack`` of its result) crashed the stub process; the mock works.
* Decoupled models (``model_transaction_policy { decoupled: true }``) run as in r24.10:
  every ``send`` of the response sender is a response at once, any number of them, until
  one carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (``send(flags=FINAL)`` alone is a
  flag-only "empty" final response); a send after it raises ``Unable to send response.
  Response sender has been closed.``. ``execute`` must return None (else every request
  without its final response gets ``Failed to process the request(s) for model
  '<instance>', message: Python model '<instance>' is using the decoupled mode and the
  execute function must return None.``); when it raises, those requests get the error as
  their final response, what was sent stays, and every sender is closed. An ``async def
  execute`` is left running on the model's loop (the instance takes the next batch at
  once); its return value is ignored and its exception only logged, as the stub does.
  :meth:`MockTriton.infer_stream` reads all responses (a gRPC stream with
  ``enable_empty_final_response``); ``infer``/``infer_batch`` refuse decoupled models with
  gRPC's ``ModelInfer RPC doesn't support models with decoupled transaction policy``
  (UNSUPPORTED; Triton's HTTP endpoint refuses them too). BLS ``exec(decoupled=True)`` /
  ``async_exec(decoupled=True)`` return (once the first response is there) a plain
  iterator of every response, the empty final one included, that starts again once
  finished; a non-decoupled target gives one response; a decoupled target called without
  ``decoupled=True`` answers ``Model <m> - Error when running inference: Model <m> is
  using the decoupled. ...``. Where Triton waits for ever for a final flag, the mock ends
  the stream after ``response_timeout`` seconds without a response with a ``mock_triton:``
  error. Decoupled models inside ensembles are refused at load (Triton runs them). Seen
  on the real 2.51 and not reproduced: a BLS ``exec(decoupled=True)`` to a decoupled model
  that sent a response with outputs from inside its *synchronous* ``execute`` never
  returned (the caller's instance stayed stuck), where one sent from another thread (as
  upstream's examples do) or a flag-only final was fine; the mock answers both.
* GPU tensors, DLPack GPU exchange, BF16, shape tensors, request rescheduling,
  sequence batching state and model warmup are not supported.
"""

from orchestrator.testing.mock.errors import InferError, LoadError, TritonError, TritonModelException
from orchestrator.testing.mock.logger import Logger
from orchestrator.testing.mock.metrics import MetricFamily
from orchestrator.testing.mock.pb_utils import install
from orchestrator.testing.mock.records import Call, LogRecord, TraceRecord
from orchestrator.testing.mock.requests import InferenceRequest, InferenceResponse
from orchestrator.testing.mock.server import MockTriton, StreamResponse
from orchestrator.testing.mock.tensors import Tensor

__all__ = [
    "install",
    "MockTriton",
    "StreamResponse",
    "InferError",
    "LoadError",
    "Call",
    "LogRecord",
    "TraceRecord",
    "Tensor",
    "InferenceRequest",
    "InferenceResponse",
    "TritonError",
    "TritonModelException",
    "Logger",
    "MetricFamily",
]
