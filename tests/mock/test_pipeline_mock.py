"""Tensor pipelines (policies with ``pipeline``) served by the router on the in-process mock:
answers byte-identical to the ensemble making the same calls (dtype, shape and bytes per
output), several data types, two outputs per step, variable dims, ``max_batch_size`` 0 and
> 0, rows of one execute merged per callee, per-request errors naming the input or the step."""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, MockTriton
from tests.pipeline_repo import CLASSES, MODELS, RECOGNIZERS, make_pipeline_repository


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = make_pipeline_repository(tmp_path_factory.mktemp("pipelines") / "model_repository")
    with MockTriton(repo, model_config_name=None, models=MODELS) as m:
        yield m


def typed_inputs(rows: int = 3, width: int = 5, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    names = np.empty((rows, 1), dtype=object)
    names[:, 0] = [bytes([65 + i]) + b"\x00\xff" for i in range(rows)]  # trailing NUL and a non-UTF-8 byte kept
    return {"X": rng.normal(size=(rows, width)).astype(np.float16), "FLAGS": rng.random((rows, 2)) < 0.5, "NAME": names}


def same(a: dict, b: dict) -> None:
    """Byte-identical per output: the same outputs, dtype, shape and bytes."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, (name, x.dtype, y.dtype, x.shape, y.shape)
        if x.dtype == object:
            assert [bytes(e) for e in x.reshape(-1)] == [bytes(e) for e in y.reshape(-1)], name
        else:
            assert x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("rows,width", [(1, 1), (3, 5), (8, 2)])
def test_a_typed_pipeline_answers_as_its_ensemble(mock, rows, width):
    inputs = typed_inputs(rows, width, seed=rows)
    got = mock.infer("typed", inputs)
    same(got, mock.infer("typed_ensemble", inputs))
    assert got["Y"].dtype == np.float16 and got["CODE"].dtype == np.int8 and got["ECHO"].dtype == np.bool_
    assert bytes(got["LABEL"][0, 0]).startswith(b"A\x00\xff:")


def test_requests_of_one_execute_with_different_variable_dims_are_each_answered(mock):
    requests = [typed_inputs(2, 3, seed=1), typed_inputs(3, 3, seed=3), typed_inputs(1, 7, seed=2)]
    mock.reset_calls()
    answers = mock.infer_batch("typed", requests)
    # Triton's batcher puts the two requests of width 3 in one execute (5 rows), which makes one
    # call to each model; the request of width 7 comes in an execute of its own
    assert mock.calls_to("typed") == [(2, 3), (1,)]
    assert mock.calls_to("mixer") == [(5,), (1,)] and mock.calls_to("labeler") == [(5,), (1,)]
    for inputs, answer in zip(requests, answers):
        same(answer, mock.infer("typed_ensemble", inputs))


def test_max_batch_size_zero_router_answers_as_its_ensemble(mock):
    v = np.array([0.5, -1.0, 2.25])
    same(mock.infer("flat_router", {"V": v}), mock.infer("flat_ensemble", {"V": v}))


def unbatched_inputs():
    name = np.empty(1, dtype=object)
    name[0] = b"Q\x00"
    return {"X": np.array([1.5, -2.0, 0.25], dtype=np.float16), "FLAGS": np.array([True, True]), "NAME": name}


def test_add_batch_dim_gives_the_batching_model_a_batch_of_one_and_strips_it_where_dims_lack_it(mock):
    inputs = unbatched_inputs()
    mock.reset_calls()
    out = mock.infer("unbatched", inputs)
    assert mock.calls_to("mixer") == [(1,)] and mock.calls_to("labeler") == [(1,)]
    assert out["Y"].shape == (3,) and out["Y"].dtype == np.float16  # [1, 3] from mixer; dims [-1]: stripped
    assert out["Y"].tobytes() == (inputs["X"] * np.float16(2)).tobytes()
    assert out["CODE"].shape == (1, 1) and out["CODE"].dtype == np.int8 and int(out["CODE"][0, 0]) == 2  # dims [1, 1]: kept
    assert out["LABEL"].shape == (1,) and bytes(out["LABEL"][0]) == b"Q\x00:2"
    assert out["ECHO"].shape == (1, 1) and out["ECHO"].dtype == np.bool_


def test_bad_input_is_that_requests_error_naming_the_input(mock):
    good = typed_inputs(2, 3)
    bad = dict(good, FLAGS=np.ones((3, 2), dtype=bool))  # a batch size that disagrees
    answers = mock.infer_batch("typed", [good, bad])
    same(answers[0], mock.infer("typed_ensemble", good))
    assert isinstance(answers[1], InferError)
    assert "FLAGS" in answers[1].message or "batch" in answers[1].message


def test_an_undeclared_parameter_is_refused_unless_ignored(mock):
    out = mock.infer("typed", typed_inputs(1), parameters={"anything": "x", "n": 3, "ok": True})
    assert set(out) == {"Y", "CODE", "LABEL", "ECHO"}


def test_a_failing_step_fails_its_requests_naming_the_step_and_model(mock):
    mock.fail_next("labeler", "boom", count=1)
    with pytest.raises(InferError) as err:
        mock.infer("typed", typed_inputs(1))
    assert "step 'labeler'" in err.value.message and "model 'labeler'" in err.value.message and "boom" in err.value.message
    assert err.value.code == "INTERNAL"


def test_a_merged_call_that_fails_is_retried_per_request(mock):
    requests = [typed_inputs(1, 3, seed=4), typed_inputs(2, 3, seed=5)]
    mock.fail_next("labeler", "once", count=1)
    answers = mock.infer_batch("typed", requests)
    assert all(not isinstance(a, InferError) for a in answers), answers
    for inputs, answer in zip(requests, answers):
        same(answer, mock.infer("typed_ensemble", inputs))


# ----------------------------------------------------------------------------- the public asks


def img(rows):
    return np.array(rows, dtype=np.float32).reshape(len(rows), 4)


def test_stop_early_skips_the_second_step_for_the_rows_that_say_so(mock):
    x = img([[1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 0, 0]])  # means 1, 0, 0.5: only the first row goes on
    mock.reset_calls()
    out = mock.infer("stop_early", {"IMG": x})
    assert [c for c in mock.calls_to("second")] == [(1,)]
    assert out["OUT"].dtype == np.float32 and out["OUT"].shape == (3, 2)
    assert out["OUT"].tolist() == [[11.0, 11.0], [-1.0, -1.0], [-1.0, -1.0]]
    mock.reset_calls()
    none = mock.infer("stop_early", {"IMG": img([[0, 0, 0, 0]])})
    assert mock.calls_to("second") == [] and none["OUT"].tolist() == [[-1.0, -1.0]]


def test_a_detector_then_a_per_class_model_sends_each_class_model_its_rows(mock):
    x = img([[5, 0, 0, 1], [0, 5, 0, 2], [0, 0, 5, 3], [6, 0, 0, 4], [0, 7, 0, 0]])  # classes 0, 1, 2, 0, 1
    mock.reset_calls()
    out = mock.infer("per_class", {"IMG": x})
    assert [bytes(e) for e in out["LABEL"].reshape(-1)] == [b"cat:6", b"dog:7", b"none", b"cat:10", b"dog:7"]
    assert [c for c in mock.calls_to(f"cls_{CLASSES[0]}")] == [(2,)]
    assert [c for c in mock.calls_to(f"cls_{CLASSES[1]}")] == [(2,)]
    assert out["PROBS"].shape == (5, 3) and out["PROBS"].dtype == np.float32


def test_one_of_n_recognizers_gets_exactly_the_rows_that_chose_it_across_requests(mock):
    def req(scripts):
        t = np.empty((len(scripts), 1), dtype=object)
        t[:, 0] = [f"w{i}{s}".encode() for i, s in enumerate(scripts)]
        return {"TEXT_IN": t, "SCRIPT": np.array(scripts, dtype=np.int32).reshape(-1, 1)}

    requests = [req([0, 1, 2, 0]), req([1, 1]), req([2, 0, 0, 0, 0])]
    mock.reset_calls()
    answers = mock.infer_batch("one_of_n", requests)
    for r, a in zip(requests, answers):
        want = [RECOGNIZERS[min(s, 2)].encode() + b":" + bytes(t)[::-1] for t, s in zip(r["TEXT_IN"].reshape(-1), r["SCRIPT"].reshape(-1))]
        assert [bytes(e) for e in a["TEXT"].reshape(-1)] == want
    rows = {m: sum(sum(c) for c in mock.calls_to(m)) for m in RECOGNIZERS}
    assert rows == {"rec_latin": 6, "rec_greek": 3, "rec_cjk": 2}
    # one execute: rec_latin's 6 rows from three requests in calls of at most its max_batch_size (4)
    assert sorted(sum(c) for c in mock.calls_to("rec_latin")) == [2, 4]


def test_stop_early_per_request_omits_the_output_as_an_ensemble_does(mock):
    mock.reset_calls()
    none = mock.infer("stop_early_request", {"IMG": img([[0, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]])})
    assert set(none) == {"SCORE"} and mock.calls_to("second") == []
    some = mock.infer("stop_early_request", {"IMG": img([[0, 0, 0, 0], [1, 1, 1, 1]])})
    assert some["OUT"].tolist() == [[1.0, 1.0], [11.0, 11.0]]  # request scope: every row of the request
    assert mock.calls_to("second") == [(2,)]


def settled(mock, family, labels, want):
    deadline = time.monotonic() + 3.0
    while (mock.metric(family, labels) or 0.0) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return mock.metric(family, labels) or 0.0


def test_steps_and_branches_count_their_rows(mock):
    labels = {"router": "per_class", "node": "by_class"}
    time.sleep(0.7)  # earlier tests' counts flushed (every 0.5 s)
    before = {b: mock.metric("orchestrator_branch_rows_total", dict(labels, branch=b)) or 0.0 for b in ("case0", "case1", "none")}
    rows = mock.metric("orchestrator_step_rows_total", {"router": "per_class", "node": "cls_cat", "model": "cls_cat"}) or 0.0
    mock.infer("per_class", {"IMG": img([[5, 0, 0, 1], [0, 5, 0, 2], [0, 0, 5, 3], [6, 0, 0, 4], [0, 7, 0, 0]])})
    assert settled(mock, "orchestrator_branch_rows_total", dict(labels, branch="none"), before["none"] + 1) == before["none"] + 1
    assert mock.metric("orchestrator_branch_rows_total", dict(labels, branch="case0")) == before["case0"] + 2
    assert mock.metric("orchestrator_branch_rows_total", dict(labels, branch="case1")) == before["case1"] + 2
    assert mock.metric("orchestrator_step_rows_total", {"router": "per_class", "node": "cls_cat", "model": "cls_cat"}) == rows + 2


def echo(mock_or_infer, parameters=None, b=True):
    inputs = {"A": np.array([[1.0], [2.0]], dtype=np.float32)}
    if b:
        inputs["B"] = np.array([[0.5], [0.25]], dtype=np.float32)
    return mock_or_infer("echo_router", inputs, parameters)


def test_optional_inputs_and_parameters_reach_the_steps(mock):
    out = echo(mock.infer, {"mode": "a", "x_n": 3, "x_b": True, "x_f": 0.5, "x_s": "s"})
    assert out["S"].reshape(-1).tolist() == [1.5, 2.25]
    # forward: every parameter BLS can carry (bool, int, str; not the double)
    assert bytes(out["P"][0, 0]) == b'{"mode": "a", "x_b": true, "x_n": 3, "x_s": "s"}'
    assert bytes(out["P_NAMED"][0, 0]) == b'{"mode": "a"}' and bytes(out["P_NONE"][0, 0]) == b"{}"
    assert echo(mock.infer, b=False)["S"].reshape(-1).tolist() == [101.0, 102.0]  # B absent reaches the model absent


@pytest.mark.parametrize("parameters,needle", [
    ({"other": 1}, "parameter 'other': not a parameter of this router"),
    ({"mode": "c"}, "parameter mode='c': not one of a, b"),
])
def test_a_parameter_the_policy_neither_declares_nor_ignores_is_refused(mock, parameters, needle):
    with pytest.raises(InferError) as err:
        echo(mock.infer, parameters)
    assert err.value.code == "INVALID_ARG" and needle in err.value.message


def test_a_failing_step_fails_only_its_request(mock):
    bad, good = {"A": np.array([[-1.0]], dtype=np.float32)}, {"A": np.array([[1.0]], dtype=np.float32)}
    answers = mock.infer_batch("echo_router", [good, bad, good])
    assert answers[0]["S"].tolist() == answers[2]["S"].tolist() == [[101.0]]
    assert isinstance(answers[1], InferError) and answers[1].code == "INTERNAL"
    assert "failed: model 'echo' failed: A = -1 refused" in answers[1].message, answers[1].message


def test_every_step_call_of_a_traced_request_is_a_child_of_its_trace(tmp_path):
    repo = make_pipeline_repository(tmp_path / "repo")
    with MockTriton(repo, model_config_name=None, models=["detector", "cls_cat", "cls_dog", "per_class"], trace_rate=1) as m:
        m.infer("per_class", {"IMG": img([[5, 0, 0, 1], [0, 5, 0, 2]])}, request_id="r1")
        [root] = [t for t in m.traces if t.parent_id == 0]
        calls = [t for t in m.traces if t.parent_id == root.id]
        assert (root.model, root.request_id) == ("per_class", "r1")
        assert sorted(c.model for c in calls) == ["cls_cat", "cls_dog", "detector"]
        assert {c.request_id for c in calls} == {"r1"}


def test_admission_runs_the_first_requests_of_an_execute_over_the_bound_and_refuses_the_rest(mock):
    from orchestrator.runtime.routing.settings import AdmissionSettings
    from orchestrator.runtime.serving.admission import Admission
    from orchestrator.runtime.serving.router import QueueDelay

    router = mock.loaded("typed_admission").instance
    router.pipeline.admission = Admission(AdmissionSettings(max_wait_ms=50))
    router.pipeline.admission.ran(1, 0.020)  # 20 ms per request: two fit in 50 ms
    router.load = QueueDelay()  # idle: no queue delay
    requests = [typed_inputs(1, 3, seed=i) for i in range(6)]
    out = mock.infer_batch("typed_admission", requests)
    for got, inputs in zip(out[:2], requests):
        same(got, mock.infer("typed", inputs))
    assert all(isinstance(o, InferError) and o.code == "UNAVAILABLE" and "overloaded" in o.message for o in out[2:])


def test_a_step_falls_back_to_its_next_model_when_its_call_fails(mock):
    inputs = typed_inputs(2, 3)
    mock.reset_calls()
    mock.fail_next("labeler", "boom", count=1)
    same(mock.infer("typed_fallback", inputs), mock.infer("typed_ensemble", inputs))
    assert mock.calls_to("labeler_spare") == [(2,)]


def test_an_on_demand_step_model_is_loaded_at_first_use_and_unloaded_when_idle(mock):
    assert not mock.is_model_ready("labeler_lazy")  # not in MODELS: never loaded by the test
    inputs = typed_inputs(2, 3)
    same(mock.infer("typed_on_demand", inputs), mock.infer("typed_ensemble", inputs))
    deadline = time.monotonic() + 10
    while mock.is_model_ready("labeler_lazy") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mock.is_model_ready("labeler_lazy")


@pytest.mark.parametrize("release", ["24.10", "26.08"])
def test_a_pipeline_router_is_not_ready_while_a_step_model_is_missing_where_the_server_asks(tmp_path, release):
    repo = make_pipeline_repository(tmp_path / "repo")
    with MockTriton(repo, model_config_name=None, release=release) as m:
        for name in ("mixer", "labeler", "labeler_lazy", "typed", "typed_on_demand"):
            m.load(name)
        assert m.is_model_ready("typed")
        m.unload("labeler")
        assert m.is_model_ready("typed") is (release == "24.10")
        m.unload("labeler_lazy")  # loaded on demand: not required
        assert m.is_model_ready("typed_on_demand")


def test_a_step_may_pin_its_model_version(tmp_path):
    from tests.pipeline_repo import TYPED_IN, TYPED_OUT, TYPED_STEPS, config, policy, write_router

    repo = make_pipeline_repository(tmp_path / "repo")
    steps = [TYPED_STEPS[0], dict(TYPED_STEPS[1], version=1)]
    write_router(repo, "typed_pinned", config("typed_pinned", 8, TYPED_IN, TYPED_OUT), policy(["Y", "CODE", "LABEL", "ECHO"], steps))
    steps = [TYPED_STEPS[0], dict(TYPED_STEPS[1], version=2)]
    write_router(repo, "typed_missing", config("typed_missing", 8, TYPED_IN, TYPED_OUT), policy(["Y", "CODE", "LABEL", "ECHO"], steps))
    with MockTriton(repo, model_config_name=None, models=["mixer", "labeler", "typed_ensemble", "typed_pinned", "typed_missing"]) as m:
        inputs = typed_inputs(2, 3)
        same(m.infer("typed_pinned", inputs), m.infer("typed_ensemble", inputs))
        with pytest.raises(InferError) as err:
            m.infer("typed_missing", inputs)
        assert "step 'labeler' failed" in err.value.message and "labeler@2" in err.value.message


@pytest.mark.parametrize("router", ["typed", "typed_unchecked"])
def test_a_cancelled_request_stops_before_its_next_step_unless_the_policy_never_asks(tmp_path, monkeypatch, router):
    from orchestrator.testing.mock import requests as mock_requests

    asked = []

    def is_cancelled(self):  # the client cancelled request "gone" once it was sent
        asked.append(self.request_id())
        return self.request_id() == "gone"

    monkeypatch.setattr(mock_requests.InferenceRequest, "is_cancelled", is_cancelled)
    repo = make_pipeline_repository(tmp_path / "repo")
    with MockTriton(repo, model_config_name=None, models=["mixer", "labeler", router]) as m:
        inputs = typed_inputs(2, 3)
        out = m.infer_batch(router, [{"inputs": inputs, "request_id": "gone"}, {"inputs": inputs, "request_id": "kept"}])
        if router == "typed":  # asked once each, before the second step only
            assert isinstance(out[0], InferError) and out[0].code == "CANCELLED"
            assert "request cancelled before step 'labeler'" in out[0].message
            assert sorted(asked) == ["gone", "kept"]
        else:  # check_cancelled: false: never asked, the request runs to its end
            assert asked == [] and not isinstance(out[0], InferError)
        assert not isinstance(out[1], InferError) and sorted(out[1]) == ["CODE", "ECHO", "LABEL", "Y"]
