"""The demo's footer states the shipped cascade's margin as the policy has it."""

from __future__ import annotations

from orchestrator.runtime.routing.nodes import walk
from orchestrator.runtime.routing.nodes.cascade import CascadeNode
from orchestrator.runtime.routing.policy import load_policy
from orchestrator.tooling.demo import cascade_margin
from tests.helpers import REPO


def test_the_footer_margin_is_the_shipped_cascades():
    policy = load_policy(REPO / "router" / "policy.yaml")
    margins = {c.margin for c in walk(policy.root) if isinstance(c, CascadeNode)}
    assert margins == {cascade_margin(REPO / "router" / "policy.yaml")}
