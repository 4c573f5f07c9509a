"""One-line mutations of the runtime that the fast tests must catch.

Each mutation names its target by the code's structure, not by its text: a module, the
function or class that holds it (a qualified name such as ``Deadlines.ask_cancelled``), and the
AST node itself, written as Python (compared after ``ast.unparse``, so line breaks, comments
and quoting do not matter), optionally with its node class or its place in its parent
(``comprehension.iter``). A target that is gone, or found more than once in that scope, is an
error that names it (:class:`TargetError`), never a silent pass.

Each mutation runs the fast loop (``pytest -m "not server and not slow and not network"``) on
the test files that cover it, in a throw-away copy of the tracked files (the working tree is
never changed); it is *caught* when they fail. A mutation that only a slow test catches says
which (``caught_by``) and is run against that test.

    python -m lab.mutations            # all (make mutations), about 2 minutes on 2 cores
    python -m lab.mutations -k shadow  # those whose name contains "shadow"
    python -m lab.mutations --check    # only find every target (seconds)

Exit status 1 when a mutation is not caught, 2 when a target is missing or ambiguous.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
FAST = "not server and not slow and not network"
ADAPTER = "tests/mock/test_router_adapter.py"
ERRORS = "tests/mock/test_router_errors.py"
OPTIONS = "tests/unit/test_server_options.py"
SEVERAL = "tests/unit/test_several.py"
REPAIR = "tests/unit/test_repair.py"
PIPELINE_RUN = "tests/unit/test_pipeline_run.py"
PIPELINE_MOCK = "tests/mock/test_pipeline_mock.py"
PIPELINE_RESHAPE = "tests/mock/test_pipeline_reshape.py"
PIPELINE_PRUNING = "tests/mock/test_pipeline_pruning.py"
PIPELINE_DESCRIBE = "tests/mock/test_pipeline_describe.py"
PIPELINE_TIMEOUT = "tests/unit/test_pipeline_timeout.py"
LINE = "tests/mock/test_line.py"


class TargetError(Exception):
    """A mutation's target is not in its scope, or is there more than once."""


@dataclass(frozen=True)
class Target:
    """An AST node of one runtime module.

    Attributes:
        path: the module's file, relative to the repository root.
        scope: the qualified name of the function or class that holds the node
            (``"ModelManager.reap"``); ``""`` for the whole module.
        code: the node as Python source (normalized with ``ast.unparse`` before comparing).
        kind: the node's AST class (``"Compare"``, ``"If"``, ``"keyword"``), when needed.
        field: ``"<parent class>.<field>"``: the node's place in its parent
            (``"comprehension.iter"``, ``"Call.func"``), when needed.
    """

    path: str
    scope: str
    code: str
    kind: str = ""
    field: str = ""

    def __str__(self) -> str:
        where = f"{self.path}:{self.scope or '<module>'}"
        extra = "".join(f" [{x}]" for x in (self.kind, self.field) if x)
        return f"{where}: {normalize(self.code, self.kind)!r}{extra}"


@dataclass(frozen=True)
class Mutation:
    """``target`` replaced by ``new`` (Python source); ``tests``: the fast test files that
    must fail; ``caught_by``: a slow test that catches it, where no fast one can."""

    name: str
    target: Target
    new: str
    tests: Tuple[str, ...]
    caught_by: str = ""


def normalize(code: str, kind: str = "") -> str:
    """``code`` as ``ast.unparse`` writes it (one expression, statements, or with ``kind``
    ``keyword``, one keyword argument)."""
    if kind == "keyword":
        call = ast.parse(f"f({code.strip()})").body[0]
        return ast.unparse(call.value.keywords[0])  # type: ignore[attr-defined]
    tree = ast.parse(code.strip())
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
        return ast.unparse(tree.body[0].value)
    return ast.unparse(tree)


def _scope(tree: ast.Module, target: Target) -> ast.AST:
    node: ast.AST = tree
    for part in filter(None, target.scope.split(".")):
        found = [n for n in getattr(node, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == part]
        if len(found) != 1:
            raise TargetError(f"{target}: {len(found)} definitions named {part!r} (need exactly one)")
        node = found[0]
    return node


def find(source: str, target: Target) -> Tuple[int, int, int, int]:
    """The one node ``target`` names in ``source``: ``(line, col, end_line, end_col)`` (lines
    from 1, columns in UTF-8 bytes, as ``ast`` gives them).

    Raises:
        TargetError: no such node, or several (naming how many and where).
    """
    tree = ast.parse(source)
    scope = _scope(tree, target)
    parents: Dict[int, Tuple[ast.AST, str]] = {}
    for parent in ast.walk(scope):
        for name, value in ast.iter_fields(parent):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    parents[id(child)] = (parent, name)
    want = normalize(target.code, target.kind)
    spans = set()
    for node in ast.walk(scope):
        if node is scope or not hasattr(node, "end_col_offset") or (target.kind and type(node).__name__ != target.kind):
            continue
        if target.field:
            parent, name = parents.get(id(node), (None, ""))
            if f"{type(parent).__name__}.{name}" != target.field:
                continue
        if ast.unparse(node) == want:  # an Expr statement and its value share a span: counted once
            spans.add((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]
    if len(spans) != 1:
        lines = ", ".join(f"line {s[0]}" for s in sorted(spans))
        raise TargetError(f"{target}: {'not found' if not spans else f'found {len(spans)} times ({lines})'}; "
                          "update the mutation in lab/mutations.py")
    return spans.pop()


def apply(source: str, target: Target, new: str) -> str:
    """``source`` with ``target``'s node replaced by ``new`` (continuation lines indented like
    the node's first line).

    Raises:
        TargetError: the target is missing or ambiguous, or the result is not valid Python
            or does not change the module's AST.
    """
    line, col, end_line, end_col = find(source, target)
    lines = source.splitlines(keepends=True)
    first, last = lines[line - 1].encode(), lines[end_line - 1].encode()
    indent = first[: len(first) - len(first.lstrip())].decode()
    replacement = new.strip().replace("\n", "\n" + indent)
    middle = first[:col].decode() + replacement + last[end_col:].decode()
    out = "".join(lines[: line - 1]) + middle + "".join(lines[end_line:])
    try:
        changed = ast.dump(ast.parse(out)) != ast.dump(ast.parse(source))
    except SyntaxError as exc:
        raise TargetError(f"{target}: replacing it by {new!r} is not valid Python: {exc}") from None
    if not changed:
        raise TargetError(f"{target}: replacing it by {new!r} changes nothing")
    return out


R = "orchestrator/runtime/"
MUTATIONS: Tuple[Mutation, ...] = (
    Mutation("POLICY output always", Target(R + "serving/router.py", "TritonPythonModel._response", "work.describe"), "True",
             (ADAPTER,)),
    Mutation("POLICY output never", Target(R + "serving/router.py", "TritonPythonModel._response", "work.describe"), "False",
             (ADAPTER,)),
    Mutation("no retry alone", Target(R + "serving/router.py", "TritonPythonModel._execute", "len(keys) == 1"), "len(keys) >= 1", (ADAPTER,)),
    Mutation("UNAVAILABLE answered as INTERNAL", Target(R + "errors.py", "UnavailableError", "'UNAVAILABLE'", kind="Constant"),
             "'INTERNAL'", (ERRORS,)),
    Mutation("a model that cannot serve does not open its circuit",
             Target(R + "bls/downstream.py", "CircuitBreaker.on_failure", "cause is not None"), "False", ("tests/unit/test_health.py", ERRORS)),
    Mutation("shadow candidates share the primary's breakers",
             Target(R + "bls/downstream.py", "Downstream.shadow_infer", "self.shadow_breaker"), "self.breaker", (ERRORS,)),
    Mutation("a node's timeout counts against its model without count_timeouts",
             Target(R + "bls/downstream.py", "CallGuard.exit", "breaker.settings.count_timeouts"), "True", ("tests/unit/test_health.py",)),
    Mutation("ROUTE built for a client that did not ask for it",
             Target(R + "serving/router.py", "TritonPythonModel._response", "'ROUTE' in asked"), "True", (ADAPTER,)),
    Mutation("a stub read through its kept descriptor counts as alive in any state",
             Target(R + "bls/stubs.py", "StubWatch._alive_by_fd", "self._judge(stat, start) == 'alive'"), "stat is not None",
             ("tests/unit/test_stubs.py",)),
    Mutation("a stub's start time is not checked (a reused pid passes for it)",
             Target(R + "bls/stubs.py", "StubWatch._judge", "stat[2] != start"), "False", ("tests/unit/test_stubs.py",)),
    Mutation("a zombie stub counts as alive",
             Target(R + "bls/stubs.py", "StubWatch._judge", "stat[1] in ('Z', 'X')"), "False", ("tests/unit/test_stubs.py",)),
    Mutation("a scan keeps the descriptors of replaced stubs open",
             Target(R + "bls/stubs.py", "StubWatch._scan", "k not in kept"), "False", ("tests/unit/test_stubs.py",)),
    Mutation("circuit_state gauge values swapped", Target(R + "bls/health.py", "", "{CLOSED: 0, OPEN: 1, HALF_OPEN: 2}"),
             "{CLOSED: 0, OPEN: 2, HALF_OPEN: 1}", ("tests/unit/test_health.py", ERRORS)),
    Mutation("circuit_state never updated",
             Target(R + "bls/downstream.py", "Downstream._circuit_changed", 'self.metrics.set("orchestrator_circuit_state", new.gauge, model=model)',
                    kind="Expr"), "pass", (ERRORS,)),
    Mutation("idle unload of models the router did not load",
             Target(R + "bls/ondemand.py", "ModelManager.reap", "self.ours", field="comprehension.iter"), "self.settings", (OPTIONS,)),
    Mutation("models outside the allowlist treated as on-demand",
             Target(R + "bls/ondemand.py", "ModelManager.acquire", "if model not in self.settings:\n    return"),
             "if model not in self.settings:\n    self.in_use.setdefault(model, 0)", (OPTIONS,)),
    Mutation("concurrent first loads not shared", Target(R + "bls/ondemand.py", "ModelManager._load_blocking", "self.loading.get(model)"),
             "None", (OPTIONS,)),
    Mutation("request ids dropped from BLS calls",
             Target(R + "bls/downstream.py", "Downstream._bls", "request_id=request_id", kind="keyword"), "request_id=''", (ADAPTER,)),
    # what a fixture with one of something cannot show (tests/unit/test_several.py)
    Mutation("a repair's config read sends the model-repository key",
             Target(R + "bls/control.py", "RepositoryControl._grpc", "'model-config' if action == 'config' else 'model-repository'"),
             "'model-repository'", (SEVERAL, OPTIONS)),
    Mutation("one instance with a new stub counts as repaired",
             Target(R + "bls/ondemand.py", "ModelManager._replaced", "any", field="Call.func"), "all", (REPAIR,)),
    Mutation("is_cancelled() raising answers CANCELLED",
             Target(R + "request.py", "Deadlines.ask_cancelled", "ctx.cancelled = False"), "ctx.cancelled = True",
             (SEVERAL, "tests/unit/test_cancel_deadline.py")),
    Mutation("a restriction split at the last colon",
             Target(R + "bls/control.py", "parse_restriction", "spec.partition(':')"), "spec.rpartition(':')", (SEVERAL, OPTIONS)),
    Mutation("the label-file check ignores label order",
             Target(R + "serving/router.py", "check_label_file", "found != wanted"), "sorted(found) != sorted(wanted)", (SEVERAL,)),
    # the engine split by job and the one error tree
    Mutation("a late request's earlier answer kept as in time",
             Target(R + "request.py", "Deadlines.in_time", "not it.context.late"), "True",
             ("tests/unit/test_error_tree.py",)),
    Mutation("every error answered INTERNAL",
             Target(R + "serving/router.py", "TritonPythonModel._fail", 'self._error(f"router: {exc}", exc.code)'),
             'self._error(f"router: {exc}", "INTERNAL")', (ADAPTER,)),
    Mutation("stage timings never observed",
             Target(R + "metrics.py", "observe_stage", "metrics and metrics.timing", field="If.test"), "None", (ADAPTER,)),
    Mutation("head binding ignores labels",
             Target(R + "routing/heads.py", "Head.compatible", "mine == tuple(x.lower() for x in other.output_labels())"), "True",
             (SEVERAL, "tests/unit/test_engine_heads.py")),
    Mutation("a cascade escalates a text whose verdict its first stage fixed",
             Target(R + "routing/nodes/cascade.py", "unsure", "answers[it.idx].verdict is None"), "True",
             ("tests/unit/test_engine.py",)),
    # the router's own time at c=1: cuts that keep every answer
    Mutation("a negative logit's sigmoid taken as a positive one's",
             Target(R + "routing/heads.py", "sigmoid", "np.where(x >= 0, 1.0, e)"), "np.where(x >= 0, 1.0, 1.0)",
             ("tests/unit/test_engine_heads.py",)),
    Mutation("a policy with a node timeout runs its executes' first step outside a task",
             Target(R + "serving/router.py", "TritonPythonModel.initialize", "not any((n.timeout_ms for n in self.policy.nodes()))"),
             "True", ("tests/mock/test_eager_execute.py",)),
    Mutation("the rest of an eager execute runs in another context than its first step",
             Target(R + "serving/router.py", "run_eagerly", "context=context", kind="keyword"), "context=None",
             ("tests/mock/test_eager_execute.py",)),
    Mutation("the loop stays marked running after an eager first step",
             Target(R + "serving/router.py", "run_eagerly", "asyncio.events._set_running_loop(None)"), "None",
             ("tests/mock/test_eager_execute.py",)),
    Mutation("a task's cancellation is not passed to the eagerly started coroutine",
             Target(R + "serving/router.py", "_Resume.__await__", "coro.throw(exc)"), "coro.send(None)",
             ("tests/mock/test_eager_execute.py",)),
    Mutation("one request's BLS call carries no timeout",
             Target(R + "request.py", "Deadlines.call_options", "0 if ctx.deadline is None else max(1, int((ctx.deadline - self.clock()) * 1000000.0))"),
             "0", ("tests/mock/test_router_cancel_deadline.py",)),
    Mutation("one request's BLS call carries no trace",
             Target(R + "request.py", "Deadlines.call_options", "CallOptions(trace=ctx.trace, timeout_us=timeout_us)"),
             "CallOptions(trace=None, timeout_us=timeout_us)", ("tests/mock/test_trace_mock.py",)),
    Mutation("a binary head's calibration shift dropped",
             Target(R + "routing/heads.py", "Head.probabilities", "not (isinstance(shift, float) and shift == 0.0)"), "False",
             ("tests/unit/test_heads.py", "tests/unit/test_calibration.py", "tests/unit/test_engine_heads.py")),
    Mutation("one text's calibration shift dropped",
             Target(R + "routing/heads.py", "Head.probabilities", "v if shift == 0.0 else v + shift"), "v",
             ("tests/unit/test_heads.py", "tests/unit/test_calibration.py", "tests/unit/test_engine_heads.py")),
    Mutation("an output left out of the router's config is built anyway",
             Target(R + "serving/router.py", "TritonPythonModel._response",
                    "work.outputs if work is not None and work.outputs is not None else self.outputs"),
             "work.outputs if work is not None and work.outputs is not None else {'PROBABILITIES', 'VERDICTS', 'ROUTE', 'POLICY'}",
             (ADAPTER,)),
    Mutation("a long text taken on the compiled line as one truncated window",
             Target(R + "execution/line.py", "Line.fits", "ids is None or (chunk is not None and ids.shape[0] > chunk.window)"),
             "ids is None", (LINE,)),
    Mutation("a text a guard case answers taken on the compiled line",
             Target(R + "execution/line.py", "Line.fits", "case.when.matches(it, None, self.model.head, guard.tokenizer)"),
             "False", (LINE,)),
    Mutation("the compiled line updates no node cost estimate around its model",
             Target(R + "execution/line.py", "Line.answer", "engine.measured(node, now - began)"), "None", (LINE,)),
    Mutation("the compiled line counts no failing node",
             Target(R + "execution/line.py", "Line.answer", "run.count('orchestrator_node_errors_total', node=node.name)"),
             "None", (LINE,)),
    Mutation("a policy with a node timeout compiled to a line",
             Target(R + "execution/line.py", "compile_line", "root.timeout_ms or any((n.timeout_ms for n in descendants(root)))"),
             "False", (LINE,)),
    Mutation("a call's logits kept in the order its rows were sent, not the items' order",
             Target(R + "execution/engine.py", "ModelCalls.classify", "order == sorted(order)"), "True",
             ("tests/unit/test_engine.py", "tests/mock/test_eager_execute.py")),
    Mutation("a call of several rows sends its first row alone",
             Target(R + "execution/engine.py", "ModelCalls.classify.inputs", "len(part) == 1"), "True",
             ("tests/unit/test_engine.py", "tests/mock/test_eager_execute.py")),
    Mutation("one negative logit's sigmoid taken as a positive one's",
             Target(R + "routing/heads.py", "sigmoid_one", "1.0 if v >= 0 else e"), "1.0",
             ("tests/unit/test_heads.py", "tests/unit/test_engine_heads.py")),
    Mutation("one calibration temperature not divided by",
             Target(R + "routing/heads.py", "Head.__post_init__", "float(t[0]) if t is not None and t.size == 1 else t"), "None",
             ("tests/unit/test_heads.py", "tests/unit/test_calibration.py")),
    Mutation("one text's logit not divided by its head's temperature",
             Target(R + "routing/heads.py", "Head.probabilities", "z.item() if divisor is None else z.item() / divisor"), "z.item()",
             ("tests/unit/test_heads.py", "tests/unit/test_calibration.py")),
    Mutation("a batch of texts tokenized as its first",
             Target(R + "execution/tokenize.py", "TextTokenizer.encode", "len(texts) == 1"), "True",
             ("tests/unit/test_tokenize.py", "tests/mock/test_eager_execute.py")),
    Mutation("a text refused for its windows still classified with the others",
             Target(R + "execution/engine.py", "Run.run", "[it for k, its in enumerate(per_work) if k not in refused for it in its]"),
             "[it for its in per_work for it in its]",
             ("tests/unit/test_engine.py",)),
    Mutation("a request's texts answered with its first text's probabilities",
             Target(R + "execution/engine.py", "Run.run", "len(answered) == 1"), "True",
             ("tests/unit/test_engine.py", "tests/mock/test_eager_execute.py")),
    Mutation("every request's parameters read as none",
             Target(R + "request.py", "request_parameters", "raw == '{}'"), "True",
             ("tests/unit/test_engine_heads.py", ADAPTER)),
    # admission control
    Mutation("admission refuses a request that ends exactly at the bound",
             Target(R + "serving/admission.py", "Admission.admit", "math.floor(room / per + 1e-09)"), "math.ceil(room / per) - 1",
             ("tests/unit/test_admission.py",)),
    Mutation("admission may refuse every request of an execute",
             Target(R + "serving/admission.py", "Admission.admit", "max(1, min(n, fits))"), "min(n, fits)",
             ("tests/unit/test_admission.py",)),
    Mutation("admission refuses the first requests instead of the last",
             Target(R + "serving/router.py", "TritonPythonModel._timed_execute", "requests[:admitted]"), "requests[len(requests) - admitted:]",
             ("tests/mock/test_admission_mock.py",)),
    Mutation("shed requests not counted",
             Target(R + "serving/router.py", "TritonPythonModel._fail", 'self.metrics.inc("orchestrator_shed_requests_total")', kind="Expr"),
             "pass", ("tests/mock/test_admission_mock.py",)),
    Mutation("chunk rounds send one window a text again",
             Target(R + "routing/nodes/chunk.py", "classify_rounds", "next_windows(engine.head, node, t)"), "1",
             ("tests/unit/test_chunk_rounds.py",)),
    Mutation("a multilabel text could settle when one label could",
             Target(R + "routing/nodes/chunk.py", "could_settle", "bool(settles.all())"), "bool(settles.any())",
             ("tests/unit/test_chunk_rounds.py",)),
    Mutation("the router ignores metrics_timing_sample",
             Target(R + "metrics.py", "router_metrics", "timing_sample(params)"), "8",
             ("tests/mock/test_metrics_sample_mock.py",)),
    Mutation("the router ignores metrics: off",
             Target(R + "metrics.py", "router_metrics", "metrics_enabled(params)"), "True",
             ("tests/mock/test_metrics_sample_mock.py",)),
    Mutation("metrics: off still hands the engine's runs a metrics sink",
             Target(R + "serving/router.py", "TritonPythonModel.initialize", "self.metrics if self.metrics.enabled else None"),
             "self.metrics", ("tests/mock/test_metrics_sample_mock.py",)),
    Mutation("metrics_timing_sample off still times every execute",
             Target(R + "execution/engine.py", "Run.__init__", "bool(getattr(metrics, 'timing', True))"), "True",
             ("tests/unit/test_engine.py",)),
    Mutation("metrics_timing_sample off still sends timing observations",
             Target(R + "metrics.py", "Metrics.__init__", "max_sampled != 0"), "True",
             ("tests/mock/test_metrics_sample_mock.py",)),
    Mutation("the flush sends every timing observation",
             Target(R + "metrics.py", "Metrics.flush", "len(values) > self.max_sampled"), "False",
             ("tests/unit/test_metrics_flush.py",)),
    # the immutable plan: run-time state with the engine
    Mutation("a node's state made afresh each execute",
             Target(R + "execution/engine.py", "Run.state", "self.engine.states[node.name]"), "make()",
             ("tests/unit/test_plan.py",)),
    # tensor pipelines: row masks, grouping per callee, scatter by row index
    Mutation("a pipeline row takes every case that holds, not the first",
             Target(R + "execution/pipeline.py", "PipelineRun._masks", "evaluate(case.when, v.tensors, v.rows, per_row, v.req.params) & ~taken"),
             "evaluate(case.when, v.tensors, v.rows, per_row, v.req.params)", (PIPELINE_RUN,)),
    Mutation("pipeline rows of one execute never share a call",
             Target(R + "execution/pipeline.py", "PipelineRun._calls", "(i, key) if separate or not merge else key"), "(i, key)",
             (PIPELINE_RUN, PIPELINE_MOCK)),
    Mutation("a branch's rows scattered back in the wrong places",
             Target(R + "execution/pipeline.py", "PipelineRun._scatter", "out[rows]", field="Assign.targets"), "out[:rows.size]",
             (PIPELINE_RUN, PIPELINE_MOCK)),
    Mutation("a pipeline step never falls back",
             Target(R + "execution/pipeline.py", "PipelineRun._failed", "step.fallback", field="If.test"), "False",
             (PIPELINE_RUN, PIPELINE_MOCK)),
    Mutation("is_cancelled is asked of a request that has just arrived",
             Target(R + "request.py", "Deadlines.ask_cancelled", "ctx.cancelled or not ctx.started"), "ctx.cancelled",
             (PIPELINE_RUN, "tests/unit/test_cancel_deadline.py")),
    Mutation("a pipeline never marks a request started, so never asks is_cancelled",
             Target(R + "execution/pipeline.py", "PipelineRun._call", "r.started = True"), "r.started = False",
             (PIPELINE_RUN,)),
    Mutation("a pipeline asks is_cancelled although its policy says check_cancelled: false",
             Target(R + "serving/pipeline.py", "PipelineRouter.parse", "request.is_cancelled if self.policy.check_cancelled else never_cancelled"),
             "request.is_cancelled", (PIPELINE_MOCK,)),
    Mutation("a text policy asks is_cancelled although it says check_cancelled: false",
             Target(R + "serving/router.py", "TritonPythonModel._parse", "self.policy.check_cancelled", field="If.test"), "True",
             ("tests/mock/test_router_cancel_deadline.py",)),
    Mutation("a failed call of several requests counts against the model's circuit",
             Target(R + "bls/downstream.py", "CallGuard.exit", "self.neutral and cause is None"), "False",
             (PIPELINE_RUN,)),
    Mutation("a failed merged pipeline call fails every request in it",
             Target(R + "execution/pipeline.py", "PipelineRun.run_step", "len({id(s[0].req) for s in segments}) > 1"), "False",
             (PIPELINE_RUN,)),
    Mutation("a request for some outputs runs every pipeline step",
             Target(R + "routing/pipeline_plan.py", "unneeded_nodes", "n.name not in needed", field="comprehension.ifs"),
             "False", (PIPELINE_PRUNING,)),
    Mutation("a pipeline node's reads do not make their writers needed",
             Target(R + "routing/pipeline_plan.py", "unneeded_nodes",
                    "{t for _, t in n.inputs} if isinstance(n, Step) else {t for c in n.cases for t in c.when.tensors()}"),
             "set()", (PIPELINE_PRUNING,)),
    Mutation("a pipeline run ignores the nodes a request skips",
             Target(R + "execution/pipeline.py", "PipelineRun.run_node", "node.name not in v.req.skip"), "True",
             (PIPELINE_PRUNING,)),
    Mutation("a call past its time is waited for, not cancelled",
             Target(R + "execution/pipeline.py", "cut_after", "task.cancel()", kind="Expr", field="AsyncFunctionDef.body"),
             "pass", (PIPELINE_TIMEOUT,)),
    Mutation("a pipeline step's timeout_ms never cuts its call",
             Target(R + "execution/pipeline.py", "PipelineRun._call", "step.timeout_ms", field="If.test"), "False",
             (PIPELINE_TIMEOUT,)),
    Mutation("a pipeline step's BLS timeout ignores its timeout_ms",
             Target(R + "execution/pipeline.py", "PipelineRun._call", "[step.timeout_ms / 1000.0] if step.timeout_ms else []"),
             "[]", (PIPELINE_TIMEOUT,)),
    Mutation("a cut merged pipeline call is retried per request",
             Target(R + "execution/pipeline.py", "PipelineRun.run_step", "not isinstance(result, RequestStopped)"), "True",
             (PIPELINE_TIMEOUT,)),
    Mutation("a cut call is always the request's deadline, never the step's",
             Target(R + "execution/pipeline.py", "PipelineRun._within", "own", field="If.test"), "False",
             (PIPELINE_TIMEOUT,)),
    Mutation("describe_policy forwarded to a pipeline's steps",
             Target(R + "serving/pipeline.py", "PipelineRouter.outputs", "params.pop(DESCRIBE_PARAMETER, False)"),
             "params.get(DESCRIBE_PARAMETER, False)", (PIPELINE_DESCRIBE,)),
    Mutation("a pipeline router answers POLICY without describe_policy",
             Target(R + "serving/pipeline.py", "PipelineRouter.outputs",
                    "self.policy_output is not None and POLICY_OUTPUT in requested and (not describe)"), "False",
             (PIPELINE_DESCRIBE,)),
    Mutation("a pipeline router never adds the POLICY output",
             Target(R + "serving/pipeline.py", "PipelineRouter.respond", "req.describe and self.policy_output is not None"),
             "False", (PIPELINE_DESCRIBE,)),
    Mutation("a batching step's batch dimension is never stripped going into a model without batching",
             Target(R + "execution/pipeline.py", "reshape_dims",
                    "batch == 1 and array.ndim > 0 and array.shape[0] == 1 and not _fits(array.shape, dims)"), "False",
             (PIPELINE_RESHAPE,)),
    Mutation("a batch dimension is prepended going into a batching model whatever the tensor's dims",
             Target(R + "execution/pipeline.py", "reshape_dims", "_fits(array.shape, dims)", field="IfExp.test"), "True",
             (PIPELINE_RESHAPE,)),
)


def _copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def check(mutations: Sequence[Mutation], root: Path = ROOT) -> List[str]:
    """The problems with ``mutations``' targets in the checkout at ``root`` (``[]``: all found)."""
    problems = []
    for m in mutations:
        try:
            apply((root / m.target.path).read_text(encoding="utf-8"), m.target, m.new)
        except (TargetError, OSError) as exc:
            problems.append(f"{m.name}: {exc}")
    return problems


def run(mutations: Sequence[Mutation]) -> List[Tuple[Mutation, str]]:
    """``(mutation, "caught" | "NOT caught")`` for each mutation.

    Raises:
        TargetError: some target is missing or ambiguous (checked before anything runs).
    """
    problems = check(mutations)
    if problems:
        raise TargetError("\n".join(problems))
    results = []
    with tempfile.TemporaryDirectory(prefix="mutations-") as tmp:
        copy = Path(tmp)
        _copy(copy)
        for m in mutations:
            target = copy / m.target.path
            original = target.read_text(encoding="utf-8")
            target.write_text(apply(original, m.target, m.new), encoding="utf-8")
            tests: Tuple[str, ...] = (m.caught_by,) if m.caught_by else m.tests
            marker: Optional[str] = None if m.caught_by else FAST
            try:
                # the copy's package comes first on sys.path (cwd), before the editable install
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                       *(["-m", marker] if marker else []), *tests],
                                      cwd=copy, capture_output=True, text=True, timeout=900)
            finally:
                target.write_text(original, encoding="utf-8")
            # exit 5: no test collected (a marker deselected them all): not a catch
            outcome = "caught" if done.returncode not in (0, 5) else "NOT caught"
            results.append((m, outcome))
            by = f" (slow: {m.caught_by})" if m.caught_by else ""
            print(f"{outcome:>10}  {m.name}{by}", flush=True)
    return results


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-k", default="", help="only mutations whose name contains this text")
    parser.add_argument("--check", action="store_true", help="only check that every target is found exactly once")
    args = parser.parse_args(list(argv) or None)
    chosen = [m for m in MUTATIONS if args.k.lower() in m.name.lower()]
    if args.check:
        problems = check(chosen)
        print("\n".join(problems) or f"all {len(chosen)} targets found once")
        return 2 if problems else 0
    try:
        results = run(chosen)
    except TargetError as exc:
        print(f"mutation targets missing or ambiguous:\n{exc}", file=sys.stderr)
        return 2
    missed = [m.name for m, outcome in results if outcome != "caught"]
    print(f"{len(results) - len(missed)} of {len(results)} caught by the fast loop" + (f"; not: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
