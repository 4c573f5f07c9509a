"""The command line around exported models: ``orchestrator serve`` takes Triton's standard
ports when they are free and says which it took instead; ``orchestrator classify`` says
when no server answers and shows each column's label (the classification extension's
``score:index:label``)."""

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
