"""The ``slow`` and ``network`` markers come from what a test uses (tests/conftest.py
``HEAVY_CALLS``): its own code, its fixtures, and the helpers of ``tests/`` it calls."""

from __future__ import annotations

import types

from tests.conftest import HEAVY_CALLS, heavy_marks

E = types.SimpleNamespace()  # stands for a module: only the names matter, nothing here runs


def _exports():
    return E.export_checkpoint("ckpt")


def _indirect():
    return [_exports() for _ in range(1)]


def _installs():
    return E.ensure_tools()


def _plain():
    return E.parse_policy({})


def item(function, *fixtures):
    info = types.SimpleNamespace(name2fixturedefs={f.__name__: [types.SimpleNamespace(func=f)] for f in fixtures})
    return types.SimpleNamespace(function=function, _fixtureinfo=info)


def test_a_test_that_exports_directly_or_through_a_helper_is_slow():
    assert heavy_marks(item(_exports)) == {"slow"}
    assert heavy_marks(item(_indirect)) == {"slow"}  # through a helper of tests/, inside a comprehension


def test_a_fixture_passes_its_markers_on_and_plain_code_gets_none():
    assert heavy_marks(item(_plain, _installs)) == {"slow", "network"}
    assert heavy_marks(item(_plain)) == set()


def test_every_marker_in_the_table_is_registered(pytestconfig):
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {m for marks in HEAVY_CALLS.values() for m in marks} | {"server"} <= registered
