"""The demo's footer states the shipped cascade's margin as the policy has it."""

from __future__ import annotations

from orchestrator.runtime.routing.nodes.cascade import CascadeNode
from orchestrator.runtime.routing.policy import load_policy
from orchestrator.tooling.demo import cascade_margin
from tests.helpers import REPO


def _cascades(node):
    if isinstance(node, CascadeNode):
        yield node
    for value in vars(node).values() if hasattr(node, "__dict__") else ():
        for child in value if isinstance(value, list) else [value]:
            if hasattr(child, "__dict__") and not isinstance(child, type):
                yield from _cascades(child)


def test_the_footer_margin_is_the_shipped_cascades():
    policy = load_policy(REPO / "router" / "policy.yaml")
    margins = {c.margin for c in _cascades(policy.root)}
    assert margins == {cascade_margin(REPO / "router" / "policy.yaml")}
