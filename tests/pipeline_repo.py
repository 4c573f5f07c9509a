"""A model repository of small Python models and tensor-pipeline routers, written by the
tests (mock and real server alike): several data types (FP16, INT8, BOOL, BYTES, FP64,
INT32), two outputs per step, a variable dimension, ``max_batch_size`` 0 and > 0, each
router beside the ensemble that makes the same calls, and the three public asks for
branching (stop early, a detector then a per-class model, one of N recognizers per row).

Every model counts nothing itself: the tests read who received which rows from the
server's statistics (Triton's per-model inference statistics; the mock's ``calls``)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List, Optional

import yaml

ROUTER_PY = "from orchestrator.runtime.serving.router import TritonPythonModel  # noqa: F401\n"

#: Python models: name -> (execute body, after ``for r in requests:``; the lines set ``outputs``).
BODIES: Dict[str, str] = {
    # X FP16 [-1], FLAGS BOOL [2] -> Y FP16 [-1] (2 X), CODE INT8 [1] (the true flags)
    "mixer": """
        x = inp(r, "X"); f = inp(r, "FLAGS")
        outputs = {"Y": (x * np.float16(2)).astype(np.float16), "CODE": f.sum(axis=-1, keepdims=True).astype(np.int8)}
    """,
    # CODE INT8 [1], NAME BYTES [1] -> LABEL BYTES [1] (NAME + b":" + code), ECHO BOOL [1] (code > 0)
    "labeler": """
        c = inp(r, "CODE"); n = inp(r, "NAME")
        lab = np.array([bytes(a) + b":" + str(int(b)).encode() for a, b in zip(n.reshape(-1), c.reshape(-1))], dtype=object)
        outputs = {"LABEL": lab.reshape(n.shape), "ECHO": c > 0}
    """,
    # V FP64 [3] -> W FP64 [3] (V + 1), N INT32 [1] (3)   (max_batch_size 0)
    "flat": """
        v = inp(r, "V")
        outputs = {"W": v + 1.0, "N": np.array([v.shape[-1]], dtype=np.int32)}
    """,
    # A FP32 [1], B FP32 [1] optional -> S FP32 [1] (A + B, or A + 100 without B), P BYTES [1] (its parameters, JSON);
    # a request with A = -1 is answered with an error
    "echo": """
        a = inp(r, "A"); b = pb_utils.get_input_tensor_by_name(r, "B")
        if (a == -1).any():
            responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("A = -1 refused")))
            continue
        s = a + (b.as_numpy() if b is not None else np.float32(100))
        p = json.dumps(json.loads(r.parameters() or "{}"), sort_keys=True).encode()
        outputs = {"S": s.astype(np.float32), "P": np.array([[p]] * a.shape[0], dtype=object)}
    """,
    # IMG FP32 [4] -> SCORE FP32 [1] (the row's mean), FEAT FP32 [4] (IMG * 10)
    "first": """
        x = inp(r, "IMG")
        outputs = {"SCORE": x.mean(axis=1, keepdims=True).astype(np.float32), "FEAT": (x * 10).astype(np.float32)}
    """,
    # FEAT FP32 [4] -> OUT FP32 [2] (its first two values + 1)
    "second": """
        x = inp(r, "FEAT")
        outputs = {"OUT": (x[:, :2] + 1).astype(np.float32)}
    """,
    # FEAT FP32 [4] -> OUT FP32 [2] (its first two values + 2), after sleeping the largest FEAT[:, 3] seconds
    "sleeper": """
        x = inp(r, "FEAT")
        time.sleep(float(x[:, 3].max()))
        outputs = {"OUT": (x[:, :2] + 2).astype(np.float32)}
    """,
    # IMG FP32 [4] -> PROBS FP32 [3] (a softmax of IMG's first three values)
    "detector": """
        x = inp(r, "IMG")[:, :3].astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        outputs = {"PROBS": (e / e.sum(axis=1, keepdims=True)).astype(np.float32)}
    """,
}

#: Models made of one body with a tag (config parameter ``tag``): BYTES out = tag + ":" + the row's sum.
TAGGED = """
        x = inp(r, "IMG")
        outputs = {"LABEL": np.array([[TAG + b":" + str(int(round(float(s)))).encode()] for s in x.sum(axis=1)], dtype=object)}
"""
#: Recognizers: TEXT_IN BYTES [1] -> TEXT BYTES [1] = tag + ":" + the row's bytes reversed.
RECOGNIZER = """
        t = inp(r, "TEXT_IN")
        outputs = {"TEXT": np.array([[TAG + b":" + bytes(e)[::-1]] for e in t.reshape(-1)], dtype=object)}
"""

MODEL_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


def inp(r, name):
    return pb_utils.get_input_tensor_by_name(r, name).as_numpy()


class TritonPythonModel:
    def initialize(self, args):
        global TAG
        params = json.loads(args["model_config"]).get("parameters", {{}})
        TAG = params.get("tag", {{}}).get("string_value", "").encode()

    def execute(self, requests):
        responses = []
        for r in requests:
{body}
            wanted = r.requested_output_names()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(k, v) for k, v in outputs.items() if not wanted or k in wanted]))
        return responses
'''


SEP = ",\n  "


def tensor(name: str, dtype: str, dims: List[int], optional: bool = False) -> str:
    opt = " optional: true" if optional else ""
    return f'{{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ]{opt} }}'


def config(name: str, max_batch: int, inputs: List[str], outputs: List[str], extra: str = "") -> str:
    batching = "dynamic_batching { }\n" if max_batch > 0 else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
            f"input [\n  {SEP.join(inputs)}\n]\noutput [\n  {SEP.join(outputs)}\n]\n"
            f'instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{batching}{extra}')


def write_model(repo: Path, name: str, cfg: str, body: str) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(cfg)
    indented = textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 12)
    (d / "1" / "model.py").write_text(MODEL_PY.format(body=indented))


def write_router(repo: Path, name: str, cfg: str, policy: dict) -> None:
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(cfg)
    (d / "1" / "model.py").write_text(ROUTER_PY)
    (d / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))


def ensemble(name: str, max_batch: int, inputs: List[str], outputs: List[str], steps: List[dict]) -> str:
    parts = []
    for s in steps:
        ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in s["inputs"].items())
        outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in s["outputs"].items())
        parts.append(f'{{ model_name: "{s["model"]}" model_version: -1 {ins} {outs} }}')
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch}\n'
            f"input [\n  {SEP.join(inputs)}\n]\noutput [\n  {SEP.join(outputs)}\n]\n"
            f"ensemble_scheduling {{ step [ {', '.join(parts)} ] }}\n")


def step(model: str, inputs: Dict[str, str], outputs: Dict[str, str], **extra: object) -> dict:
    return {"kind": "step", "model": model, "inputs": inputs, "outputs": outputs, **extra}


def policy(outputs: List[str], steps: List[dict], params: Optional[List[str]] = None) -> dict:
    return {"version": 1, "ignored_parameters": params if params is not None else ["*"],
            "pipeline": {"outputs": outputs, "steps": steps}}


# ----------------------------------------------------------------------------- the repository

TYPED_IN = [tensor("X", "TYPE_FP16", [-1]), tensor("FLAGS", "TYPE_BOOL", [2]), tensor("NAME", "TYPE_STRING", [1])]
TYPED_OUT = [tensor("Y", "TYPE_FP16", [-1]), tensor("CODE", "TYPE_INT8", [1]), tensor("LABEL", "TYPE_STRING", [1]),
             tensor("ECHO", "TYPE_BOOL", [1])]
TYPED_STEPS = [step("mixer", {"X": "X", "FLAGS": "FLAGS"}, {"Y": "Y", "CODE": "CODE"}),
               step("labeler", {"CODE": "CODE", "NAME": "NAME"}, {"LABEL": "LABEL", "ECHO": "ECHO"})]

FLAT_IN = [tensor("V", "TYPE_FP64", [3])]
FLAT_OUT = [tensor("W", "TYPE_FP64", [3]), tensor("N", "TYPE_INT32", [1])]

IMG = tensor("IMG", "TYPE_FP32", [4])
CLASSES = ("cat", "dog")  # the detector's classes 0 and 1 have their own model; class 2 has none
RECOGNIZERS = ("rec_latin", "rec_greek", "rec_cjk")

#: The three public asks, as pipeline policies (the guide shows the same, checked by a test).
STOP_EARLY = policy(["SCORE", "OUT"], [
    step("first", {"IMG": "IMG"}, {"SCORE": "SCORE", "FEAT": "FEAT"}),
    step("second", {"FEAT": "FEAT"}, {"OUT": "OUT"},
         when={"tensor": "SCORE", "op": "gt", "value": 0.5}, scope="row", fill={"OUT": [-1.0, -1.0]}),
])
#: Stop early per request: a request none of whose rows scores over 0.5 is answered without OUT.
STOP_EARLY_REQUEST = policy(["SCORE", "OUT"], [
    step("first", {"IMG": "IMG"}, {"SCORE": "SCORE", "FEAT": "FEAT"}),
    step("second", {"FEAT": "FEAT"}, {"OUT": "OUT"},
         when={"tensor": "SCORE", "op": "gt", "value": 0.5, "reduce": "any"}, scope="request", omit=["OUT"]),
])
PER_CLASS = policy(["PROBS", "LABEL"], [
    step("detector", {"IMG": "IMG"}, {"PROBS": "PROBS"}),
    {"kind": "switch", "name": "by_class", "scope": "row",
     "cases": [{"when": {"tensor": "PROBS", "reduce": "argmax", "op": "eq", "value": i},
                "then": [step(f"cls_{c}", {"IMG": "IMG"}, {"LABEL": "LABEL"})]} for i, c in enumerate(CLASSES)],
     "fill": {"LABEL": "none"}},
])
ONE_OF_N = policy(["TEXT"], [
    {"kind": "switch", "name": "recognizer", "scope": "row",
     "cases": [{"when": {"tensor": "SCRIPT", "op": "eq", "value": i},
                "then": [step(m, {"TEXT_IN": "TEXT_IN"}, {"TEXT": "TEXT"})]} for i, m in enumerate(RECOGNIZERS[:-1])],
     "default": [step(RECOGNIZERS[-1], {"TEXT_IN": "TEXT_IN"}, {"TEXT": "TEXT"})]},
])


#: The ``timeout_ms`` of the ``timed*`` routers' step.
TIMED_MS = 300
#: The router's optional output of its policy document (requests with ``describe_policy: true``).
POLICY_OUT = tensor("POLICY", "TYPE_STRING", [1])
#: A fork: two outputs from a chain (first -> second), one from a step beside it (detector).
FORK_OUT = [tensor("SCORE", "TYPE_FP32", [1]), tensor("OUT", "TYPE_FP32", [2]), tensor("PROBS", "TYPE_FP32", [3])]
FORK_STEPS = [step("first", {"IMG": "IMG"}, {"SCORE": "SCORE", "FEAT": "FEAT"}),
              step("second", {"FEAT": "FEAT"}, {"OUT": "OUT"}),
              step("detector", {"IMG": "IMG"}, {"PROBS": "PROBS"})]


def make_pipeline_repository(repo: Path) -> Path:
    """Write every model and router of this module into ``repo`` (created); returns it."""
    repo.mkdir(parents=True, exist_ok=True)
    write_model(repo, "mixer", config("mixer", 8, TYPED_IN[:2], TYPED_OUT[:2]), BODIES["mixer"])
    write_model(repo, "labeler", config("labeler", 8, [tensor("CODE", "TYPE_INT8", [1]), tensor("NAME", "TYPE_STRING", [1])],
                                        TYPED_OUT[2:]), BODIES["labeler"])
    write_router(repo, "typed", config("typed", 8, TYPED_IN, TYPED_OUT), policy(["Y", "CODE", "LABEL", "ECHO"], TYPED_STEPS))
    warm = ('model_warmup [ { name: "sample" batch_size: 2 inputs [ '
            '{ key: "X" value: { data_type: TYPE_FP16 dims: [ 3 ] zero_data: true } }, '
            '{ key: "FLAGS" value: { data_type: TYPE_BOOL dims: [ 2 ] zero_data: true } }, '
            '{ key: "NAME" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } ] } ]\n')
    write_router(repo, "typed_warm", config("typed_warm", 8, TYPED_IN, TYPED_OUT, warm),
                 policy(["Y", "CODE", "LABEL", "ECHO"], TYPED_STEPS))
    write_model(repo, "labeler_spare", config("labeler_spare", 8, [tensor("CODE", "TYPE_INT8", [1]), tensor("NAME", "TYPE_STRING", [1])],
                                              TYPED_OUT[2:]), BODIES["labeler"])
    write_router(repo, "typed_fallback", config("typed_fallback", 8, TYPED_IN, TYPED_OUT),
                 policy(["Y", "CODE", "LABEL", "ECHO"], [TYPED_STEPS[0], dict(TYPED_STEPS[1], fallback=["labeler_spare"])]))
    write_router(repo, "typed_on_demand", config("typed_on_demand", 8, TYPED_IN, TYPED_OUT),
                 policy(["Y", "CODE", "LABEL", "ECHO"], [TYPED_STEPS[0], dict(
                     TYPED_STEPS[1], model="labeler_lazy", on_demand={"idle_timeout_s": 0.3, "retry_after_s": 60})]))
    write_model(repo, "labeler_lazy", config("labeler_lazy", 8, [tensor("CODE", "TYPE_INT8", [1]), tensor("NAME", "TYPE_STRING", [1])],
                                             TYPED_OUT[2:]), BODIES["labeler"])
    admitted = policy(["Y", "CODE", "LABEL", "ECHO"], TYPED_STEPS)
    admitted["admission"] = {"max_wait_ms": 50}
    write_router(repo, "typed_admission", config("typed_admission", 8, TYPED_IN, TYPED_OUT), admitted)
    write_router(repo, "typed_unchecked", config("typed_unchecked", 8, TYPED_IN, TYPED_OUT),
                 dict(policy(["Y", "CODE", "LABEL", "ECHO"], TYPED_STEPS), check_cancelled=False))
    (repo / "typed_ensemble").mkdir(exist_ok=True)
    (repo / "typed_ensemble" / "1").mkdir(exist_ok=True)
    (repo / "typed_ensemble" / "config.pbtxt").write_text(ensemble("typed_ensemble", 8, TYPED_IN, TYPED_OUT, TYPED_STEPS))

    write_model(repo, "flat", config("flat", 0, FLAT_IN, FLAT_OUT), BODIES["flat"])
    flat_steps = [step("flat", {"V": "V"}, {"W": "W", "N": "N"})]
    write_router(repo, "flat_router", config("flat_router", 0, FLAT_IN, FLAT_OUT + [POLICY_OUT]), policy(["W", "N"], flat_steps))
    (repo / "flat_ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "flat_ensemble" / "config.pbtxt").write_text(ensemble("flat_ensemble", 0, FLAT_IN, FLAT_OUT, flat_steps))
    # max_batch_size 0 around a batching model: add_batch_dim in, stripped out where the dims lack it
    unbatched_in = [tensor("X", "TYPE_FP16", [-1]), tensor("FLAGS", "TYPE_BOOL", [2]), tensor("NAME", "TYPE_STRING", [1])]
    unbatched_out = [tensor("Y", "TYPE_FP16", [-1]), tensor("CODE", "TYPE_INT8", [1, 1]), tensor("LABEL", "TYPE_STRING", [1]),
                     tensor("ECHO", "TYPE_BOOL", [1, 1])]
    unbatched_steps = TYPED_STEPS
    write_router(repo, "unbatched", config("unbatched", 0, unbatched_in, unbatched_out),
                 policy(["Y", "CODE", "LABEL", "ECHO"], [dict(s, add_batch_dim=True) for s in unbatched_steps]))
    (repo / "unbatched_ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "unbatched_ensemble" / "config.pbtxt").write_text(
        ensemble("unbatched_ensemble", 0, unbatched_in, unbatched_out, unbatched_steps))

    # optional inputs and request parameters
    echo_in = [tensor("A", "TYPE_FP32", [1]), tensor("B", "TYPE_FP32", [1], optional=True)]
    write_model(repo, "echo", config("echo", 8, echo_in, [tensor("S", "TYPE_FP32", [1]), tensor("P", "TYPE_STRING", [1])]),
                BODIES["echo"])
    echo_policy = policy(["S", "P", "P_NAMED", "P_NONE"], [
        step("echo", {"A": "A", "B": "B"}, {"S": "S", "P": "P"}),
        step("echo", {"A": "A"}, {"P": "P_NAMED"}, name="echo_named", parameters=["mode"]),
        step("echo", {"A": "A"}, {"P": "P_NONE"}, name="echo_none", parameters="none"),
    ], params=["x_*"])
    echo_policy["request_parameters"] = {"mode": ["a", "b"]}
    # echo refuses some inputs: its three steps' failures must not open its circuit for the others
    echo_policy["circuit_breaker"] = {"consecutive_failures": 50}
    write_router(repo, "echo_router", config("echo_router", 8, echo_in, [
        tensor("S", "TYPE_FP32", [1]), tensor("P", "TYPE_STRING", [1]), tensor("P_NAMED", "TYPE_STRING", [1]),
        tensor("P_NONE", "TYPE_STRING", [1])]), echo_policy)

    # the public asks
    write_model(repo, "first", config("first", 8, [IMG], [tensor("SCORE", "TYPE_FP32", [1]), tensor("FEAT", "TYPE_FP32", [4])]),
                BODIES["first"])
    write_model(repo, "second", config("second", 8, [tensor("FEAT", "TYPE_FP32", [4])], [tensor("OUT", "TYPE_FP32", [2])]),
                BODIES["second"])
    write_router(repo, "stop_early", config("stop_early", 8, [IMG], [tensor("SCORE", "TYPE_FP32", [1]),
                                                                    tensor("OUT", "TYPE_FP32", [2])]), STOP_EARLY)
    write_router(repo, "stop_early_request", config("stop_early_request", 8, [IMG], [
        tensor("SCORE", "TYPE_FP32", [1]), tensor("OUT", "TYPE_FP32", [2])]), STOP_EARLY_REQUEST)
    write_model(repo, "detector", config("detector", 8, [IMG], [tensor("PROBS", "TYPE_FP32", [3])]), BODIES["detector"])
    for c in CLASSES:
        write_model(repo, f"cls_{c}", config(f"cls_{c}", 8, [IMG], [tensor("LABEL", "TYPE_STRING", [1])],
                                             f'parameters {{ key: "tag" value {{ string_value: "{c}" }} }}\n'), TAGGED)
    write_router(repo, "per_class", config("per_class", 8, [IMG], [tensor("PROBS", "TYPE_FP32", [3]),
                                                                  tensor("LABEL", "TYPE_STRING", [1])]), PER_CLASS)
    write_router(repo, "fork", config("fork", 8, [IMG], FORK_OUT + [POLICY_OUT]), policy(["SCORE", "OUT", "PROBS"], FORK_STEPS))
    (repo / "fork_ensemble" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "fork_ensemble" / "config.pbtxt").write_text(ensemble("fork_ensemble", 8, [IMG], FORK_OUT, FORK_STEPS))
    # a step's timeout_ms: sleeper sleeps FEAT[:, 3] seconds; second (FEAT -> OUT) is its fallback
    feat, out = [tensor("FEAT", "TYPE_FP32", [4])], [tensor("OUT", "TYPE_FP32", [2])]
    write_model(repo, "sleeper", config("sleeper", 8, feat, out), BODIES["sleeper"])
    timed = step("sleeper", {"FEAT": "FEAT"}, {"OUT": "OUT"}, timeout_ms=TIMED_MS)
    for name, extra, breaker in (("timed", {}, {}), ("timed_fallback", {"fallback": ["second"]}, {}),
                                 ("timed_counting", {}, {"count_timeouts": True, "open_s": 60})):
        p = policy(["OUT"], [dict(timed, **extra)])
        p["circuit_breaker"] = {"consecutive_failures": 1, **breaker}
        write_router(repo, name, config(name, 8, feat, out), p)
    for m in RECOGNIZERS:
        write_model(repo, m, config(m, 4, [tensor("TEXT_IN", "TYPE_STRING", [1])], [tensor("TEXT", "TYPE_STRING", [1])],
                                    f'parameters {{ key: "tag" value {{ string_value: "{m}" }} }}\n'), RECOGNIZER)
    write_router(repo, "one_of_n", config("one_of_n", 16, [tensor("TEXT_IN", "TYPE_STRING", [1]), tensor("SCRIPT", "TYPE_INT32", [1])],
                                          [tensor("TEXT", "TYPE_STRING", [1])]), ONE_OF_N)
    return repo


#: Every model directory ``make_pipeline_repository`` writes.
MODELS = ["echo", "echo_router", "mixer", "labeler", "typed", "typed_warm", "typed_admission", "labeler_spare", "typed_fallback", "typed_on_demand", "typed_ensemble", "flat", "flat_router", "flat_ensemble", "unbatched",
          "unbatched_ensemble", "first", "second", "stop_early", "stop_early_request", "detector", *(f"cls_{c}" for c in CLASSES), "per_class", "fork", "fork_ensemble",
          "sleeper", "timed", "timed_fallback", "timed_counting",
          *RECOGNIZERS, "one_of_n"]
