"""The README's "Route your own model", walked as written (docs/guides/bring-your-own-model.md
has the same steps in more detail), with two checkpoints made here: a 3-label BERT
(WordPiece) and a 2-logit RoBERTa (byte-level BPE). The commands, the example policy and
the load loop are read from the README, with ``mymodel``, ``CKPT`` and ``model_repository``
put in and the example's 512 tokens made the checkpoints' 48 (513 -> 49, stride 384 -> 36):

1. ``orchestrator export CKPT --name mymodel --repo model_repository --router --fp16``
2. the README's policy (a cascade from the fp16 copy to the fp32 model, long texts chunked)
   written to ``mymodel_router/policy.yaml``, and its ``orchestrator policy check``
3. a running server (the image's restricted repository API) takes the new models through
   the README's load loop with the admin key (``mymodel_fp16`` before the router, as it says)
4. ``orchestrator classify "some text" --model mymodel_router``; every answer through
   tritonclient is what ``transformers`` answers for the checkpoint (torch, here); request
   parameters (``--param``) reach the router over HTTP and gRPC
5. re-export with ``--replace`` keeps the edited policy (the new starter beside it); the
   export without ``--name`` is refused, and without ``--replace`` too.

One server start: the README's other way, a restart that loads the models at start, is how
tests/server/test_byom.py serves exported models.
"""

from __future__ import annotations

import re
import shlex
import urllib.request

import numpy as np
import pytest

from orchestrator.tooling.cli import main
from orchestrator.tooling.client import classify
from orchestrator.tooling.modeling.export.starter import STARTER_BESIDE, starter_policy
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.production import KEY_HEADER
from tests.byom import MAX_LENGTH, TEXTS, build_checkpoint, expected_probabilities

pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")

TOPICS = ("sports", "politics", "technology")
#: model name -> (checkpoint spec for tests/byom.py, output labels)
MODELS = {
    "topics": (("bert", TOPICS, "single_label_classification"), TOPICS),
    "sentiment": (("roberta", 2, None), ("LABEL_1",)),  # 2 logits: P(the second label)
}
KEY = "test-admin-key-readme"
#: the README example's numbers for a 512-token model -> ours (max_length 48)
TOKENS = {"512": str(MAX_LENGTH), "513": str(MAX_LENGTH + 1), "384": str(MAX_LENGTH * 3 // 4)}
#: fp16 answers: 0.05 logit at most (the export's bound) moves a probability by < 0.025
FP16_ATOL = 0.025


def readme_section() -> str:
    readme = (PROJECT_ROOT / "README.md").read_text()
    m = re.search(r"^## Route your own model\n(.*?)^## ", readme, re.S | re.M)
    assert m, "README: the section 'Route your own model' is missing"
    return m.group(1)


def blocks(kind: str) -> list:
    return re.findall(rf"```{kind}\n(.*?)```", readme_section(), re.S)


def command(prefix: str, name: str, repo, ckpt=None) -> list:
    """The README's ``orchestrator <prefix>...`` line as ``main`` arguments, for model ``name``."""
    lines = [ln for b in blocks("bash") for ln in b.splitlines() if ln.startswith(f"orchestrator {prefix}")]
    assert len(lines) == 1, f"README: one `orchestrator {prefix}` line expected, found {lines}"
    args = []
    for token in shlex.split(lines[0])[1:]:
        token = token.replace("mymodel", name)
        if token.startswith("model_repository"):
            token = str(repo) + token[len("model_repository"):]
        args.append(str(ckpt) if token == "CKPT" else token)
    return args


def readme_policy(name: str) -> str:
    (policy,) = [b for b in blocks("yaml") if "root:" in b]
    policy = re.sub(r"\b(512|513|384)\b", lambda m: TOKENS[m.group(1)], policy)
    return policy.replace("mymodel", name)


def readme_load_order(name: str) -> list:
    """The README's load loop for ``name``; with its cascade, ``NAME_fp16`` before the router."""
    m = re.search(r"for m in ((?:mymodel\w*\s*)+); do", readme_section())
    assert m, "README: the repository-load loop of 'Route your own model' is missing"
    assert "load `mymodel_fp16` before `mymodel_router`" in readme_section()
    names = [n.replace("mymodel", name) for n in m.group(1).split()]
    return names[:-1] + [f"{name}_fp16", names[-1]]


def load(url: str, name: str, key) -> int:
    req = urllib.request.Request(f"http://{url}/v2/repository/models/{name}/load", data=b"", method="POST",
                                 headers={KEY_HEADER: key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    out = {}
    for name, (spec, _) in MODELS.items():
        path = build_checkpoint(name, base / name, spec=spec)
        out[name] = (path, expected_probabilities(path))
    return out


def test_route_your_own_model_as_the_readme_says(checkpoints, tmp_path, capsys):
    from orchestrator.tooling.server import TritonServer

    repo = tmp_path / "model_repository"
    repo.mkdir()
    # A running server (the image's restricted repository API) before the models exist.
    server = TritonServer(repo, models=[], control_key=KEY).start()
    try:
        for name, (ckpt, _) in checkpoints.items():
            # 1. export, with a router of its own and the fp16 copy
            assert main(command("export", name, repo, ckpt) + ["--quiet"]) == 0, capsys.readouterr().err
            assert (repo / f"{name}_router" / "labels.txt").read_text().splitlines() == list(MODELS[name][1])
            # 2. the README's policy in place of the starter, and the check it gives
            (repo / f"{name}_router" / "policy.yaml").write_text(readme_policy(name))
            assert main(command("policy check", name, repo)) == 0, capsys.readouterr().err
            assert f"models {name}, {name}_fp16 are in {repo}" in capsys.readouterr().out
        # 3. the README's load loop: without the key the image refuses, with it each loads
        assert load(server.http_url, "topics_tokenizer", None) == 403
        for name in MODELS:
            for model in readme_load_order(name):
                assert load(server.http_url, model, KEY) == 200, (model, server.log_path)
        # 4. answers: the ensembles', the routers' and the README's classify command
        for name, (_, expected) in checkpoints.items():
            check_answers(server, name, expected, capsys)
        check_parameters(server, capsys)
    finally:
        server.stop()

    # 5. a re-export as the README says (--replace) keeps the edited policy
    ckpt = checkpoints["topics"][0]
    policy = repo / "topics_router" / "policy.yaml"
    export = command("export", "topics", repo, ckpt) + ["--quiet"]
    assert main(export) == 2
    assert "error: export would replace topics, topics_tokenizer, " in capsys.readouterr().err
    assert "--replace" in readme_section() and STARTER_BESIDE in readme_section()
    assert main(export + ["--replace"]) == 0, capsys.readouterr().err
    assert f"kept your edited {policy}" in capsys.readouterr().err
    from orchestrator.runtime.routing.heads import read_head

    assert policy.read_text() == readme_policy("topics")
    assert (policy.parent / STARTER_BESIDE).read_text() == starter_policy("topics", read_head(repo / "topics"))
    assert main(command("policy check", "topics", repo)) == 0, capsys.readouterr().err
    # and without --name it is refused, naming what is missing
    args = command("export", "topics", repo, ckpt)
    i = args.index("--name")
    assert main(args[:i] + args[i + 2:]) == 2
    assert capsys.readouterr().err.startswith("error: --name NAME is required with SOURCE")


def check_answers(server, name, expected, capsys):
    labels = MODELS[name][1]
    short = [i for i, t in enumerate(TEXTS) if t and len(t.split()) < 20]  # within the model's 48 tokens
    # the ensemble (fp32): transformers' own probabilities
    ens = classify([TEXTS[i] for i in short], model=f"{name}_ensemble", url=server.http_url, threshold=0.5)
    np.testing.assert_allclose([p.probabilities for p in ens], expected[short], rtol=0, atol=1e-5)
    # the router: the fp16 copy's answer, or the fp32 model's when the cascade escalates
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        preds = classify(TEXTS, model=f"{name}_router", url=url, protocol=protocol, threshold=0.5)
        assert [p.labels for p in preds] == [labels] * len(TEXTS)
        for i in short:
            assert preds[i].route in (f"{name}_fp16", name), preds[i]  # a model node's route: its model
            atol = FP16_ATOL if preds[i].route == f"{name}_fp16" else 1e-5
            np.testing.assert_allclose(preds[i].probabilities, expected[i], rtol=0, atol=atol, err_msg=preds[i].route)
        assert preds[TEXTS.index("")].route == "empty"
        assert preds[TEXTS.index("")].probabilities == pytest.approx([0.5] * len(labels))
        long = max(range(len(TEXTS)), key=lambda i: len(TEXTS[i]))  # 120 words: windows of 48 tokens
        assert preds[long].route.startswith(f"chunked:{name}"), preds[long]
    # the README's classify command (with this server's URL)
    assert main(command("classify", name, server.http_url) + ["--url", server.http_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(tuple(labels) + ("not ", "none")) and f" {name}" in out, out


def check_parameters(server, capsys):
    """--param reaches the router: a declared one is accepted, an undeclared one refused by name."""
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        base = ["classify", "a good movie", "--model", "topics_router", "--url", url, "--protocol", protocol]
        assert main(base + ["--param", "describe_policy=false"]) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert main(base + ["--param", "route=fast"]) == 1
        err = capsys.readouterr().err
        assert "parameter 'route': not a parameter of this router (it accepts: describe_policy)" in err, err
