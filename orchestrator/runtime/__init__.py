"""What runs inside Triton's Python-backend stub. Imports nothing from ``orchestrator.tooling``.

Where a request goes, module by module:

1. ``router.py``      ``TritonPythonModel``: Triton calls ``execute(requests)``; one
                      response per request, errors per request.
2. ``request.py``     each request's ``TEXT``/``THRESHOLD``/parameters validated
                      (``validation.py``) into a ``Work``.
3. ``engine.py``      the texts of all requests of the call enter the policy's root node.
4. ``policy.py``      the routing policy (YAML) read and validated at ``initialize``.
5. ``nodes/``         one module per node kind (dataclass, validation, handler), found
                      through ``nodes.KINDS``.
6. ``ondemand.py``    on-demand models loaded before their first call, unloaded when idle.
7. ``downstream.py``  BLS calls through circuit breakers (``health.py``), the stub watch
                      (``stubs.py``) and repairs (``ondemand.py``, ``control.py``).
8. ``heads.py``       logits to ``PROBABILITIES``/``VERDICTS`` by each model's head.
9. ``metrics.py``     counters and latencies on Triton's ``/metrics``.

``models/`` holds the other Python-backend models (tokenizer, ONNX classifier through
onnxruntime, postprocess); ``errors.py`` the three error types a request can meet.
"""
