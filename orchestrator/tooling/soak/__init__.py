"""Fault-injection soak of the router (issue 11): ``orchestrator soak`` / ``make soak``.

Starts its own embedded server (loopback, ``--model-control-mode=explicit``) on a copy of
the model repository, sends a mixed workload (empty, short and long texts, 1-16 texts a
request, varied thresholds, ``route=fast``/``accurate`` and the cascade, HTTP and gRPC,
several client threads), checks every answer by request id against the answers computed
while healthy, injects faults on a schedule (unload/reload ``classifier``, SIGKILL the
``classifier_fast`` stub, reload the ``router``, oversized texts) and reports sent,
answered, correct, errors by message, lost, duplicated and mismatched responses, latency
per phase and the bounds of issue 11. docs/results/reliability.md describes it and holds a run.

Modules: :mod:`~orchestrator.tooling.soak.workload` (texts, requests, the correctness
rule), :mod:`~orchestrator.tooling.soak.ledger` (outcomes by request id),
:mod:`~orchestrator.tooling.soak.clients` (HTTP/gRPC), :mod:`~orchestrator.tooling.soak.procs`
(stub processes through /proc), :mod:`~orchestrator.tooling.soak.runner` (the schedule),
:mod:`~orchestrator.tooling.soak.report` (JSON/Markdown), :mod:`~orchestrator.tooling.soak.command`
(the CLI: ``add_soak_arguments``, ``soak_command``; this package file imports nothing, so
no module of the package comes back through it). :mod:`~orchestrator.tooling.soak.repairs` (``python -m
orchestrator.tooling.soak.repairs``) measures which repository-API request brings a new stub
soonest after a kill. Both run the server under the image's conditions
(:mod:`orchestrator.tooling.production`).
"""
