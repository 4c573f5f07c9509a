"""The embedded server's failure report, offline (tooling/server.py)."""

from __future__ import annotations


def test_a_failed_start_shows_the_real_error_first_and_harmless_lines_apart():
    from orchestrator.tooling.server import split_error_lines

    lines = [
        "model 'router' is not called during warmup",
        "model 'classifier' is not called during warmup",
        "Unable to find a CUDA driver on this machine",
        "ValueError: bad value",
        "failed to load 'router_b' version 1: Invalid argument: unexpected model name 'router' in config of 'router_b'",
        "error: creating server: Internal - failed to load all models",
    ]
    errors, harmless = split_error_lines(lines)
    assert errors[0].startswith("failed to load 'router_b'") and errors[1].startswith("error: creating server")
    assert errors[2:] == ["ValueError: bad value"]
    assert harmless == lines[:3]
