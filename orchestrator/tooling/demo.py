"""``make demo``: real held-out sentences through ``router`` and ``ensemble`` in a real Triton.

Starts the embedded server on ``model_repository/`` (loopback, free ports), classifies a
handful of texts from the test split of the human-rated corpus (short ones, a negated one,
a long multi-paragraph text over the classifiers' 128-token limit, and an empty one)
through both models over HTTP with tritonclient, prints them side by side with the
people's mean rating, and stops the server.
"""

from __future__ import annotations

import argparse
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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO)
    parser.add_argument("--threshold", type=float, default=0.5)
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 130))
    rows = demo_texts()
    texts = [t for _, t, _ in rows]
    console.print(f"Starting the embedded Triton server on [bold]{args.repo}[/bold] ...")
    try:
        with TritonServer(args.repo) as server:
            console.print(f"Server ready: HTTP {server.http_url}, gRPC {server.grpc_url}, log {server.log_path}")
            router = classify(texts, model="router", url=server.http_url, threshold=args.threshold)
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
            f"{'positive' if r.verdict else 'negative'} {r.probability:.3f}",
            r.route,
            f"{'positive' if e.verdict else 'negative'} {e.probability:.3f}",
        )
    console.print(table)
    console.print(
        "The router answers the empty text without a model, chunks the long text into overlapping "
        "128-token windows (the ensemble truncates it), and escalates to `classifier` only texts whose "
        "`classifier_fast` probability is within 0.15 of the threshold."
    )
    console.print("Server stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
