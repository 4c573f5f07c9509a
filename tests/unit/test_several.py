"""Cases a fixture with one of something cannot show: several restricted API
groups with different keys, a binary head stand-in whose positive label differs, a label file
in another order, a restriction value holding ``:``, and a request whose ``is_cancelled()``
raises. Several instances per model: ``tests/unit/test_repair.py``. Each case is one of
``make mutations``' targets (``lab/mutations.py``)."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest

from orchestrator.runtime.bls import control
from orchestrator.runtime.bls.control import RepositoryControl, ServerOptions, parse_restriction
from orchestrator.runtime.errors import PolicyError, RequestCancelled
from orchestrator.runtime.request import Result
from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, Head
from orchestrator.runtime.routing.policy import bind_heads, parse_policy
from orchestrator.runtime.serving.router import check_label_file
from tests.unit.test_cancel_deadline import Clock, TimedBLS, cascade, engine_for, work

# ----------------------------------------------------------------------------- restricted groups


class FakeGrpcClient:
    """``tritonclient.grpc.InferenceServerClient``: records each call with the headers sent."""

    sent: list = []

    def __init__(self, url, channel_args=None):
        self.url = url

    def get_model_config(self, model, headers=None, as_json=False, client_timeout=None):
        self.sent.append(("config", model, headers))
        return {"config": {"name": model, "backend": "python"}}

    def load_model(self, model, headers=None, client_timeout=None, config=None):
        self.sent.append(("load", model, headers))

    def unload_model(self, model, headers=None, unload_dependents=False, client_timeout=None):
        self.sent.append(("unload", model, headers))

    def close(self):
        pass


@pytest.fixture()
def fake_grpc(monkeypatch):
    FakeGrpcClient.sent = []
    module = types.SimpleNamespace(InferenceServerClient=FakeGrpcClient, InferenceServerException=RuntimeError)
    monkeypatch.setattr(control, "_grpc_client", lambda: module)
    return FakeGrpcClient.sent


def test_a_repair_over_grpc_sends_each_restricted_group_its_own_key(tmp_path, fake_grpc):
    """The image restricts every admin group; a deployment may give each group its own key.
    A repair reads the configuration (group ``model-config``) and loads (``model-repository``):
    each request must carry its own group's key, or Triton refuses it."""
    options = ServerOptions.parse([
        "tritonserver", "--model-control-mode=explicit",
        "--grpc-restricted-protocol=model-config:cfg-key=C1",
        "--grpc-restricted-protocol=model-repository:repo-key=R2",
        "--grpc-restricted-protocol=statistics,logging:other-key=O3",
    ], tmp_path)
    assert RepositoryControl(None, options).reload("classifier", "123") == "config"
    assert fake_grpc == [
        ("config", "classifier", {"triton-grpc-protocol-cfg-key": "C1"}),
        ("load", "classifier", {"triton-grpc-protocol-repo-key": "R2"}),
    ]
    RepositoryControl(None, options).unload("classifier")
    assert fake_grpc[-1] == ("unload", "classifier", {"triton-grpc-protocol-repo-key": "R2"})


def test_a_restriction_value_holding_colons_is_split_at_the_first_colon():
    """Triton splits ``<groups>:<key>=<value>`` at the first ``:``; the value (a key from a
    secret, a URL-like token) may hold more."""
    assert parse_restriction("model-repository,model-config:admin-key=ab:cd:ef") == [
        ("model-repository", "admin-key", "ab:cd:ef"), ("model-config", "admin-key", "ab:cd:ef")]
    assert parse_restriction("model-repository:k=http://h:1") == [("model-repository", "k", "http://h:1")]


# ----------------------------------------------------------------------------- heads and labels


def binary_policy():
    return parse_policy({"version": 1, "root": {"kind": "cascade", "name": "c", "margin": 0.1, "stages": [
        {"kind": "model", "name": "a", "model": "spam_a"}, {"kind": "model", "name": "b", "model": "spam_b"}]}})


def test_two_binary_models_whose_positive_labels_differ_do_not_stand_in_for_each_other():
    """Both binary with two logits; one's positive label is ``spam``, the other's ``ham``: a
    cascade between them would mix P(spam) and P(ham) in one column."""
    spam = Head(BINARY, ("ham", "spam"), positive_index=1)
    ham = Head(BINARY, ("ham", "spam"), positive_index=0)
    with pytest.raises(PolicyError, match=r"root.stages\[1\].model: 'spam_b' has a binary \(2 logits, positive label 'ham'\) head"):
        bind_heads(binary_policy(), {"spam_a": spam, "spam_b": ham})
    same = Head(BINARY, ("not_spam", "SPAM"), positive_index=1)  # another negative label, the positive's case
    assert bind_heads(binary_policy(), {"spam_a": spam, "spam_b": same}).head is spam


def test_a_label_file_with_the_right_labels_in_another_order_is_refused(tmp_path):
    """Triton's classification extension names column i after line i: the same labels in
    another order would name every column wrongly."""
    policy = bind_heads(parse_policy({"version": 1, "root": {"kind": "model", "name": "m", "model": "mc"}}),
                        {"mc": Head(MULTICLASS, ("neg", "neutral", "pos"))})
    config = {"output": [{"name": "PROBABILITIES", "label_filename": "labels.txt"}]}
    (tmp_path / "labels.txt").write_text("neg\nneutral\npos\n")
    check_label_file(tmp_path, config, policy, tmp_path / "policy.yaml")  # the right order loads
    (tmp_path / "labels.txt").write_text("pos\nneutral\nneg\n")
    with pytest.raises(ValueError, match=r"says \['pos', 'neutral', 'neg'\], but the policy's models answer \['neg', 'neutral', 'pos'\]"):
        check_label_file(tmp_path, config, policy, tmp_path / "policy.yaml")


# ----------------------------------------------------------------------------- is_cancelled() raising


def test_a_request_whose_is_cancelled_raises_is_answered_not_cancelled():
    """``is_cancelled()`` is an IPC round trip to the server; when asking fails, nothing says
    the client cancelled. Answering CANCELLED would tell a client that is still waiting it
    cancelled a request it did not (Triton drops the response of a request really cancelled
    anyway), so the request goes on and gets its answer."""
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)

    def broken():
        raise RuntimeError("Failed to check the cancellation status of the request")

    [got] = asyncio.run(engine.run([work(["good bad"], "e", is_cancelled=broken)]))
    assert not isinstance(got, RequestCancelled), got
    assert isinstance(got, Result) and got.routes == ["accurate"]
    assert fake.models_called() == ["tokenizer", "fast", "accurate"]
    assert counts.get("orchestrator_cancelled_requests_total") == 0.0
    np.testing.assert_equal(got.probabilities.shape, (1, 1))
