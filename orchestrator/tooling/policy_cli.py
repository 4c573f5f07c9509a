"""``orchestrator policy check PATH`` and ``orchestrator policy show --url``."""

from __future__ import annotations

import json
import sys

from orchestrator.runtime import policy as P


def fetch_policy(url: str, model: str = "router", protocol: str = "http") -> dict:
    """The policy document the running ``model`` uses, from its optional ``POLICY`` output.

    Sends one empty text (answered without any model by policies that guard empty texts)
    with the request parameter ``describe_policy: true``.

    Raises:
        tritonclient.utils.InferenceServerException: the server is unreachable or the model
            refuses the request.
        RuntimeError: the model has no ``POLICY`` output (not an orchestrator router).
    """
    from orchestrator.tooling.client import client_module, text_inputs

    tc = client_module(protocol)
    client = tc.InferenceServerClient(url)
    try:
        inputs = text_inputs(tc, [""])
        outputs = [tc.InferRequestedOutput("POLICY")]
        result = client.infer(model, inputs, outputs=outputs, parameters={"describe_policy": True})
    finally:
        client.close()
    value = result.as_numpy("POLICY")
    if value is None:
        raise RuntimeError(f"model '{model}' returned no POLICY output: is it an orchestrator router?")
    return json.loads(value.reshape(-1)[0])


def add_policy_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="policy_command", required=True)
    check = sub.add_parser("check", help="validate a policy file offline and print its graph")
    check.add_argument("path", help="policy file (.yaml, .yml or .json)")
    show = sub.add_parser("show", help="print the policy a running router uses")
    show.add_argument("--url", default=None, help="host:port (default 127.0.0.1:8000 http, :8001 grpc)")
    show.add_argument("--model", default="router")
    show.add_argument("--protocol", choices=("http", "grpc"), default="http")
    show.add_argument("--json", action="store_true", help="print the policy document as JSON instead of the graph")


def policy_command(args) -> int:
    if args.policy_command == "check":
        try:
            policy = P.load_policy(args.path)
        except P.PolicyError as exc:
            print(f"invalid policy: {exc}", file=sys.stderr)
            return 1
        print(P.describe(policy))
        print("policy is valid")
        return 0
    from tritonclient.utils import InferenceServerException

    from orchestrator.tooling.client import DEFAULT_URLS

    try:
        document = fetch_policy(args.url or DEFAULT_URLS[args.protocol], args.model, args.protocol)
    except (InferenceServerException, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=2) if args.json else P.describe(P.parse_policy(document)))
    return 0
