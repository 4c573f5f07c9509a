"""``make demo``: real held-out sentences through ``router`` and ``ensemble`` in a real Triton.

Starts the embedded server on ``model_repository/`` (loopback, free ports), classifies a
handful of texts from the test split of the human-rated corpus (short ones, a negated one,
a long multi-paragraph text over the classifiers' 128-token limit, and an empty one)
through both models over HTTP with tritonclient, plus the first held-out text the fast
classifier is unsure of (the cascade escalates it to ``classifier``), prints them side by
side with the people's mean rating, marks each answer that disagrees with the people, says
how accurate the demo models are (``model_repository/training_metrics.json``, the numbers of
``MODEL_CARD.md``), and stops the server.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from rich.console import Console
from rich.table import Table

from orchestrator.tooling.client import classify
from orchestrator.tooling.modeling import data
from orchestrator.tooling.paths import default_model_repository
from orchestrator.tooling.server import ServerError, TritonServer

REPO = default_model_repository()


def demo_texts() -> List[Tuple[str, str, Optional[float]]]:
    """``(kind, text, mean human rating or None)`` for the demo, all from the test split."""
    test = data.held_out_examples()
    by_corpus = {c: [e for e in test if e.corpus == c] for c in data.CORPORA}
    picked = []
    for corpus in ("movie_reviews", "tweets", "amazon_reviews", "nyt_editorials"):
        e = next(e for e in by_corpus[corpus] if abs(e.rating) >= 1.5 and 40 <= len(e.text) <= 140)
        picked.append((f"short ({corpus})", e.text, e.rating))
    negated = next(
        e for e in by_corpus["movie_reviews"] if (" not " in e.text or "n't" in e.text) and e.rating <= -1.0 and len(e.text) < 140
    )
    picked.append(("negated", negated.text, negated.rating))
    # A review of several paragraphs: consecutive negative movie snippets, well over 128 tokens.
    negative = [e for e in by_corpus["movie_reviews"] if e.rating <= -1.0][:18]
    paragraphs = ["\n".join(e.text for e in negative[i : i + 6]) for i in range(0, 18, 6)]
    mean = sum(e.rating for e in negative) / len(negative)
    picked.append(("long, 3 paragraphs", "\n\n".join(paragraphs), mean))
    picked.append(("empty", "", None))
    return picked


#: held-out texts tried, in order, to find one the cascade escalates (one request)
ESCALATION_CANDIDATES = 200


def escalation_candidates() -> List[Tuple[str, str, Optional[float]]]:
    """Short held-out texts, any corpus, to find one whose ``classifier_fast`` answer is unsure."""
    test = [e for e in data.held_out_examples() if 30 <= len(e.text) <= 140]
    return [("unsure: escalated", e.text, e.rating) for e in test[:ESCALATION_CANDIDATES]]


def accuracy_note(repo: Path) -> str:
    """The demo models' measured test-split accuracy, from ``training_metrics.json``."""
    try:
        test = json.loads((repo / "training_metrics.json").read_text())["test"]
        acc = {m: test[m]["all"]["accuracy"] for m in ("classifier", "classifier_fast")}
    except (OSError, ValueError, KeyError):
        return "The demo models are small and often wrong (model_repository/MODEL_CARD.md)."
    return (f"The demo models are small and wrong on about one text in five: test-split accuracy "
            f"{acc['classifier']:.1%} (classifier) and {acc['classifier_fast']:.1%} (classifier_fast) "
            f"(model_repository/MODEL_CARD.md), weakest on negation and sarcasm; \u2717 marks an answer that "
            f"disagrees with the people's rating.")


def _first_escalated(candidates, url: str, threshold: float):
    """``(row, answer)`` of the first candidate the router escalates, in requests of 64 texts
    (the router's max_batch_size); None when none of them is."""
    for start in range(0, len(candidates), 64):
        chunk = candidates[start:start + 64]
        answers = classify([t for _, t, _ in chunk], model="router", url=url, threshold=threshold)
        for row, answer in zip(chunk, answers):
            if answer.route == "classifier":
                return row, answer
    return None


WRONG = " \u2717"  # an answer that disagrees with the people's rating


def _verdict(pred, rating: Optional[float]) -> str:
    wrong = rating is not None and pred.verdict != (rating > 0)
    return f"{'positive' if pred.verdict else 'negative'} {pred.probability:.3f}{WRONG if wrong else ''}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--threshold", type=float, default=0.5)
    for proto in ("http", "grpc", "metrics"):  # as `orchestrator serve` (make demo HTTP_PORT=...)
        parser.add_argument(f"--{proto}-port", type=int, default=None,
                            help=f"the server's {proto} port (default: a free one; a given port must be free)")
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 130))
    rows = demo_texts()
    texts = [t for _, t, _ in rows]
    console.print(f"Starting the embedded Triton server on [bold]{args.repo}[/bold] ...")
    try:
        with TritonServer(args.repo, http_port=args.http_port, grpc_port=args.grpc_port,
                          metrics_port=args.metrics_port) as server:
            console.print(f"Server ready: HTTP {server.http_url}, gRPC {server.grpc_url}, log {server.log_path}")
            router = classify(texts, model="router", url=server.http_url, threshold=args.threshold)
            # a text the cascade escalates: the first candidate the router sends to `classifier`
            found = _first_escalated(escalation_candidates(), server.http_url, args.threshold)
            if found is not None:
                rows.insert(len(rows) - 2, found[0])
                router.insert(len(router) - 2, found[1])
                texts = [t for _, t, _ in rows]
            ensemble = classify(texts, model="ensemble", url=server.http_url, threshold=args.threshold)
    except ServerError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    table = Table(title=f"router vs ensemble (threshold {args.threshold}; positive = probability >= threshold)")
    table.add_column("text", overflow="fold", ratio=3)
    for col in ("people (mean rating)", "router", "route", "ensemble"):
        table.add_column(col, no_wrap=True)
    for (kind, text, rating), r, e in zip(rows, router, ensemble):
        shown = " ".join(text.split())
        shown = (shown[:90] + f"... ({len(text)} chars)") if len(shown) > 90 else shown
        human = "-" if rating is None else f"{'positive' if rating > 0 else 'negative'} ({rating:+.2f})"
        table.add_row(
            f"[bold]{kind}[/bold]\n{shown!r}",
            human,
            _verdict(r, rating),
            r.route,
            _verdict(e, rating),
        )
    console.print(table)
    margin = cascade_margin(Path(args.repo) / "router" / "policy.yaml")
    console.print(
        "The router answers the empty text without a model, chunks the long text into overlapping "
        "128-token windows (the ensemble truncates it), and escalates to `classifier` only texts whose "
        f"`classifier_fast` probability is within {margin:g} of the threshold (the row 'unsure: escalated'; "
        "the policy's cascade margin, chosen by `orchestrator tune`, docs/guides/tune.md)."
    )
    console.print(accuracy_note(args.repo))
    console.print("Server stopped.")
    return 0


def cascade_margin(policy_path: Path) -> float:
    """The margin of the first cascade node in a router's policy file (what the footer says)."""
    import yaml

    todo = [yaml.safe_load(policy_path.read_text())]
    while todo:
        node = todo.pop(0)
        if isinstance(node, dict):
            if node.get("kind") == "cascade" and "margin" in node:
                return float(node["margin"])
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    raise ValueError(f"{policy_path}: no cascade node with a margin")


if __name__ == "__main__":
    sys.exit(main())
