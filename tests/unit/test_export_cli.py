"""The command line around exported models: ``orchestrator serve`` takes Triton's standard
ports when they are free and says which it took instead; ``orchestrator classify`` says
when no server answers and shows each column's label (the classification extension's
``score:index:label``) and sends request parameters (``--param KEY=VALUE``)."""

from __future__ import annotations

import socket

import pytest

from orchestrator.tooling import client as C
from orchestrator.tooling import serve
from orchestrator.tooling.cli import main
from orchestrator.tooling.server import find_free_ports


def test_standard_ports_when_free_else_picked_and_said(monkeypatch):
    free, busy, other = find_free_ports(3)
    monkeypatch.setattr(serve, "STANDARD_PORTS", {"http": free, "grpc": busy, "metrics": other})
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", busy))
        holder.listen()
        ports, taken = serve.standard_ports("127.0.0.1", {"http": None, "grpc": None, "metrics": 9999})
    assert ports == {"http": free, "grpc": None, "metrics": 9999} and taken == {"grpc": busy}
    assert serve.taken_notes(taken, {"grpc": "127.0.0.1:41234"}) == [
        f"port {busy} was in use, so grpc took 41234 instead (clients: --url 127.0.0.1:41234)"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_says_when_no_server_answers(protocol, capsys):
    url = f"127.0.0.1:{find_free_ports(1)[0]}"  # nothing listens there
    with pytest.raises(C.ServerUnavailable, match=rf"^no Triton server answers at {url} \(connection refused"):
        C.classify(["hello"], model="ensemble", url=url, protocol=protocol, timeout_s=5)
    assert main(["classify", "hello", "--url", url, "--protocol", protocol]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: no Triton server answers at {url} (connection refused")
    assert "start one with `orchestrator serve`" in err and "Traceback" not in err


def test_classification_strings_to_columns():
    assert C.parse_classes([b"0.7:2:3 stars", b"0.2:0:1 star", b"0.1:1:2 stars"], 3) == (
        (0.2, 0.1, 0.7), ("1 star", "2 stars", "3 stars"))
    assert C.parse_classes([b"0.25:0"], 1) == ((0.25,), ("0",))  # a model without a label file


def test_format_prediction_per_head():
    binary = C.Prediction("great", 0.9, True, "fast", (0.9,), (True,), ("POSITIVE",))
    assert C.format_prediction(binary).startswith("POSITIVE         0.9000  fast")
    assert C.format_prediction(C.Prediction("meh", 0.1, False, None, (0.1,), (False,), ("POSITIVE",))).startswith(
        "not POSITIVE     0.1000  -")
    multi = C.Prediction("you idiot", 0.8, True, None, (0.8, 0.1, 0.6), (True, False, True), ("toxic", "threat", "insult"))
    assert C.format_prediction(multi).startswith("toxic,insult     toxic=0.8000 insult=0.6000 threat=0.1000  -")


@pytest.mark.parametrize("text, pair", [
    ("route=fast", ("route", "fast")), ("describe_policy=true", ("describe_policy", True)),
    ("flag=False", ("flag", False)), ("n=3", ("n", 3)), ("n=-3", ("n", -3)), ("x=0.25", ("x", 0.25)),
    ("x=1e-3", ("x", 1e-3)), ("v=1.2.3", ("v", "1.2.3")), ("empty=", ("empty", "")), ("a=b=c", ("a", "b=c")),
    ("nan=nan", ("nan", "nan")),
])
def test_request_parameter_values_are_typed_when_they_look_like_one(text, pair):
    value = C.request_parameter(text)
    assert value == pair and type(value[1]) is type(pair[1])


class _Fields(dict):
    __getattr__ = dict.__getitem__


class _FakeClient:
    """tritonclient's InferenceServerClient for one router with ROUTE: records each infer."""

    calls: list = []

    def __init__(self, url, **kwargs):
        self.url = url

    def get_model_metadata(self, model):  # read as JSON (HTTP) and as protobuf fields (gRPC)
        return _Fields(outputs=[_Fields(name=n, shape=[-1, 1]) for n in ("PROBABILITIES", "VERDICTS", "ROUTE")])

    def infer(self, model, inputs, outputs=None, **kwargs):
        import numpy as np

        _FakeClient.calls.append((model, kwargs))
        arrays = {"PROBABILITIES": np.array([[b"0.9:0:positive"]], dtype=object),
                  "VERDICTS": np.array([[True]]), "ROUTE": np.array([[b"fast"]], dtype=object)}
        return type("Result", (), {"as_numpy": staticmethod(arrays.get)})()

    def close(self):
        pass


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_sends_request_parameters(protocol, monkeypatch, capsys):
    import types

    real = C.client_module(protocol)
    fake = types.SimpleNamespace(InferenceServerClient=_FakeClient, InferInput=real.InferInput,
                                 InferRequestedOutput=real.InferRequestedOutput)
    monkeypatch.setattr(C, "client_module", lambda p: fake)
    _FakeClient.calls = []
    assert main(["classify", "hi", "--url", "h:1", "--protocol", protocol,
                 "--param", "route=fast", "--param", "describe_policy=false", "--param", "n=2"]) == 0
    assert main(["classify", "hi", "--url", "h:1", "--protocol", protocol]) == 0
    (model, sent), (_, unsent) = _FakeClient.calls
    assert model == "router" and sent["parameters"] == {"route": "fast", "describe_policy": False, "n": 2}
    assert "parameters" not in unsent
    assert capsys.readouterr().out.startswith("positive")


def test_classify_param_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["classify", "hi", "--param", "route"])
    assert exc.value.code == 2 and "'route': expected KEY=VALUE, e.g. route=fast" in capsys.readouterr().err

