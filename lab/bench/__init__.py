"""Benchmarks: ``router`` against ``ensemble`` and the raw ONNX model, with perf_analyzer.

``make bench`` or ``python -m lab.bench [--quick] [--out docs/results]``:

1. copies ``model_repository/`` to a temporary directory and adds the benchmark-only
   variants of :data:`.plan.VARIANTS` (``tokenizer_pad512`` + ``ensemble_pad512``: the seeds'
   ensemble, padding every text to 512 tokens; ``router_single``: the router sending every
   text to ``classifier``, i.e. the routing overhead alone);
2. starts one embedded Triton 2.51 server (:class:`orchestrator.tooling.server.TritonServer`) on it;
3. sends the held-out test split (:func:`orchestrator.tooling.modeling.data.held_out_examples`) through
   ``ensemble``, ``router`` and ``router_single`` with tritonclient and scores their verdicts
   against the human labels (accuracy);
4. runs Triton's load generator ``perf_analyzer`` (2.41.0, from the ``tritonclient==2.41.0``
   wheel, installed by :func:`.perf_analyzer.install_perf_analyzer` into ``.cache/tools/perf_analyzer/``)
   against each model: gRPC, one text per request, ``--input-data`` JSON made of real
   held-out texts (THRESHOLD 0.5), concurrency 1, 4 and 16 (:func:`.plan.bench_plan`), plus a
   length sweep (short, medium, over 128 tokens) and a client batch sweep (1, 4, 16);
5. times the raw ONNX classifiers in this process through onnxruntime on the same token
   batches (the compute floor);
6. writes ``<out>/benchmarks.md``, ``<out>/bench/results.json`` and PNG plots in
   ``<out>/bench/``.

Units everywhere: latency in milliseconds (perf_analyzer reports microseconds; converted),
throughput in inferences (texts) per second, ``infer/s``. Every number in the report comes
from ``results.json`` of the same run: perf_analyzer's CSV (``-f``) for throughput and
p50/p90/p95/p99, its profile export (``--profile-export-file``) for per-window throughput,
tritonclient for accuracy and routes, ``time.perf_counter`` around
``onnxruntime.InferenceSession.run`` for the raw floor, ``/proc`` and the server's metadata
for the machine description.

Errors: :class:`.plan.BenchError` (perf_analyzer cannot be installed or run, a variant cannot be
built, the data cannot be read); :class:`orchestrator.tooling.server.ServerError` from the server.
A single perf_analyzer measurement that fails is recorded with its error and the run goes
on; the report shows it as failed.

Modules: :mod:`.plan` (variants, levels, window settings, :class:`BenchError`),
:mod:`.perf_analyzer` (install, run, parse), :mod:`.variants` (the benchmark repository),
:mod:`.measurement` (input data, rounds, accuracy, the raw floor), :mod:`.goals` (ratios
and goals), :mod:`.machine`, :mod:`.report` and :mod:`.plots` (``benchmarks.md`` and the
PNGs), :mod:`.run` (one run), :mod:`.cli` (the command line; ``__main__``),
:mod:`.features` (``make bench-features``: warmup, response cache and shadow cost),
:mod:`.pipeline` (``make bench-pipeline``: a migrated pipeline against its ensemble, a
hand-written BLS model and a cost model), :mod:`.tune_check` (``make bench-tune-check``:
``orchestrator tune --url``'s predictions against what three margins then measure).
This package re-exports nothing: import from the module that defines a name.
"""
