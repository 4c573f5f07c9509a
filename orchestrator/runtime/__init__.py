"""What runs inside Triton's Python-backend stub. Imports nothing from ``orchestrator.tooling``.

One subpackage per concern (docs/development/architecture.md draws them):

- ``serving/``    Triton's side: ``router.py`` (``TritonPythonModel``: one response per
                  request, errors per request), ``request.py`` (each request's inputs
                  validated into a ``Work``), admission control, the queue-delay estimate,
                  what the running python_backend release offers.
- ``execution/``  the ``Engine`` made at load and one ``Run`` per execute (``engine.py``),
                  model calls and tokens, deadlines and cancellation, the shadow queue.
- ``routing/``    the policy format, read and bound to the models' heads at ``initialize``:
                  the declaration and parser, ``heads.py`` (logits to
                  ``PROBABILITIES``/``VERDICTS``), one module per node kind (``nodes/``).
- ``bls/``        the downstream models: BLS calls through circuit breakers, the stub
                  watch, on-demand loading and repairs, the server's repository API.

``metrics.py`` (counters and latencies on Triton's ``/metrics``) and ``errors.py`` serve
them all; ``models/`` holds the other Python-backend models (tokenizer, ONNX classifier
through onnxruntime, postprocess).
"""
