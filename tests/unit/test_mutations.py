"""``make mutations`` finds its targets by the code's structure (lab/mutations.py):
a target is found whatever its formatting, refused when gone or ambiguous, and every shipped
mutation's target is in the runtime exactly once."""

from __future__ import annotations

import pytest

from lab.mutations import MUTATIONS, Target, TargetError, apply, check, find

SOURCE = '''
LIMITS = {"a": 1, "b": 2}


class Gate:
    code = "OPEN"

    def allow(self, n, keys):
        if n == 1:  # one alone
            return True
        total = sum(k for k in keys)
        return (n
                >= 3) and total > 0

    def deny(self, n):
        return n == 1 or n == 1


def call(f, rid):
    return f(x=1, request_id=rid)
'''


def target(scope, code, **kw):
    return Target("m.py", scope, code, **kw)


def test_a_target_is_found_by_structure_whatever_its_formatting():
    # written another way than in the source: spacing, line breaks, parentheses, quotes
    assert find(SOURCE, target("Gate.allow", "n>=3"))[:2] == (12, 16)
    assert find(SOURCE, target("Gate", "'OPEN'", kind="Constant"))[0] == 6
    assert find(SOURCE, target("", "{'a': 1, 'b': 2}"))[0] == 2
    assert find(SOURCE, target("call", "request_id=rid", kind="keyword"))[0] == 20
    assert find(SOURCE, target("Gate.allow", "sum", field="Call.func"))[0] == 11


def test_apply_replaces_only_the_node_and_keeps_the_rest():
    out = apply(SOURCE, target("Gate.allow", "n == 1"), "n >= 1")
    assert "if n >= 1:  # one alone" in out and out.count("n == 1") == 2  # deny's two are untouched
    out = apply(SOURCE, target("Gate.allow", "if n == 1:\n    return True"), "if n == 1:\n    pass")
    assert "        if n == 1:\n            pass\n        total" in out  # the statement, comment included, replaced
    out = apply(SOURCE, target("call", "request_id=rid", kind="keyword"), "request_id=''")
    assert "f(x=1, request_id='')" in out


def test_a_missing_target_is_refused_naming_it():
    with pytest.raises(TargetError, match=r"m.py:Gate.allow: 'n == 2'.*not found"):
        find(SOURCE, target("Gate.allow", "n == 2"))
    with pytest.raises(TargetError, match=r"0 definitions named 'close'"):
        find(SOURCE, target("Gate.close", "n == 1"))
    with pytest.raises(TargetError, match="changes nothing"):
        apply(SOURCE, target("Gate.allow", "n == 1"), "n  ==  1")
    with pytest.raises(TargetError, match="not valid Python"):
        apply(SOURCE, target("Gate.allow", "n == 1"), "n ==")


def test_an_ambiguous_target_is_refused_with_where_it_is():
    with pytest.raises(TargetError, match=r"found 2 times \(line 16, line 16\)"):
        find(SOURCE, target("Gate.deny", "n == 1"))
    with pytest.raises(TargetError, match=r"found 3 times"):
        find(SOURCE, target("", "n == 1"))  # the whole module: allow's and deny's


def test_every_shipped_mutation_finds_its_target_once_and_names_its_tests():
    assert check(MUTATIONS) == []
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    for m in MUTATIONS:
        assert m.tests and all(t.startswith("tests/") for t in m.tests), m.name
