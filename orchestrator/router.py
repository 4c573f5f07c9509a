"""The router: one Python-backend model that replaces the ``ensemble`` DAG.

Same inputs and outputs as ``ensemble`` plus ``ROUTE``, so a client switches by model name:
    TEXT           TYPE_STRING [N, 1]  UTF-8 texts
    THRESHOLD      FP32        [N, 1]  decision threshold per text, in [0, 1]
    PROBABILITIES  FP32        [N, 1]  probability of the positive class
    VERDICTS       BOOL        [N, 1]  PROBABILITIES >= THRESHOLD
    ROUTE          TYPE_STRING [N, 1]  the branch that answered (see below)

Branches, per text (``ROUTE`` value in brackets):
1. ``[empty]`` empty or whitespace-only text: answered without calling any model, with
   PROBABILITIES 0.5 (no evidence either way) and VERDICTS false (never flagged),
   whatever the threshold.
2. ``[chunked:<model>]`` a text longer than ``max_sequence_length`` tokens (128, the
   classifiers' ``model_max_length``): its tokens are split into overlapping windows of
   ``max_sequence_length`` (each re-wrapped in the first and last special tokens, [CLS] and
   [SEP] for BERT), windows start every ``chunk_stride`` tokens (the last window is aligned
   to the end of the text), all windows are classified in the same concurrent BLS calls
   as the other texts, and the text's probability is the window probabilities' mean
   weighted by each window's token count (``chunk_aggregation``: also ``mean`` or ``max``).
   An ensemble can only truncate such a text.
3. ``[classifier_fast]`` / ``[classifier]`` cascade: every text goes to
   ``classifier_fast`` first; only texts whose probability lies within ``cascade_margin``
   of their threshold (strictly) go to ``classifier`` and pay for it.
4. Batching: the texts of all requests in one ``execute`` call are tokenized in one BLS
   call, classified in one call per model, and post-processed in one call (calls are split
   at ``bls_max_batch_size`` rows, the downstream models' ``max_batch_size``, and sent
   concurrently); rows are sorted by length so each call pads as little as possible.

The final probabilities and verdicts come from the ``postprocess`` model (one BLS call),
so the router and the ensemble share one definition of both. A chunked text is sent there
as the logit of its aggregated probability.

Errors: bad input gives that request an INVALID_ARG error naming the input. A failing
downstream model gives an INTERNAL error naming the model; when several requests were
batched together, each is retried alone so only the requests that fail get the error.
Every request gets exactly one response.
"""

from __future__ import annotations

import asyncio
import math
import traceback
from dataclasses import dataclass, fields
from typing import Awaitable, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from orchestrator.validation import InputError, check_thresholds, config_parameters, decode_texts

ROUTE_EMPTY = "empty"
AGGREGATIONS = ("length_weighted_mean", "mean", "max")
EMPTY_PROBABILITY = 0.5


class DownstreamError(RuntimeError):
    """A BLS call returned an error; the message names the model."""


@dataclass(frozen=True)
class RouterSettings:
    """The router's knobs, read from ``config.pbtxt`` ``parameters`` (all strings there).

    Defaults: ``max_sequence_length`` 128 is the demo tokenizer's ``model_max_length``;
    ``chunk_stride`` 96 gives windows that overlap by 30 content tokens; ``cascade_margin``
    0.15 and ``bls_max_batch_size`` 64 (the downstream models' ``max_batch_size``).
    """

    tokenizer_model: str = "tokenizer"
    fast_model: str = "classifier_fast"
    accurate_model: str = "classifier"
    postprocess_model: str = "postprocess"
    max_sequence_length: int = 128
    chunk_stride: int = 96
    chunk_aggregation: str = "length_weighted_mean"
    cascade_margin: float = 0.15
    bls_max_batch_size: int = 64

    @classmethod
    def from_parameters(cls, params: Mapping[str, str]) -> "RouterSettings":
        """Build settings from config parameters; unknown keys are ignored.

        Raises:
            ValueError: a value of the wrong type or out of range, naming the parameter.
        """
        values = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            raw = params[f.name]
            kind = type(getattr(cls, f.name))
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ValueError(f"router: parameter {f.name}={raw!r} is not a valid {kind.__name__}") from None
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ValueError naming the first parameter out of range."""
        if self.max_sequence_length < 3:
            raise ValueError(f"router: parameter max_sequence_length={self.max_sequence_length} must be >= 3")
        if not 1 <= self.chunk_stride <= self.max_sequence_length - 2:
            raise ValueError(
                f"router: parameter chunk_stride={self.chunk_stride} must be in [1, max_sequence_length - 2]"
            )
        if self.chunk_aggregation not in AGGREGATIONS:
            raise ValueError(f"router: parameter chunk_aggregation={self.chunk_aggregation!r}, expected one of {AGGREGATIONS}")
        if not (math.isfinite(self.cascade_margin) and 0.0 <= self.cascade_margin <= 1.0):
            raise ValueError(f"router: parameter cascade_margin={self.cascade_margin} must be in [0, 1]")
        if self.bls_max_batch_size < 1:
            raise ValueError(f"router: parameter bls_max_batch_size={self.bls_max_batch_size} must be >= 1")


def token_windows(ids: np.ndarray, max_length: int, stride: int) -> List[np.ndarray]:
    """Split one tokenized text into overlapping windows of at most ``max_length`` tokens.

    Args:
        ids: int64 [T] token ids of the whole text, first and last being special tokens
            ([CLS] ... [SEP] for BERT).
        max_length: window length in tokens, special tokens included.
        stride: content tokens between the starts of consecutive windows.

    Returns:
        A list of int64 arrays, each ``[first] + content slice + [last]``; together they
        cover every content token, the last window ends at the text's last content token.
        A text of at most ``max_length`` tokens comes back as one window, itself.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if ids.shape[0] <= max_length:
        return [ids]
    body, width = ids[1:-1], max_length - 2
    starts = list(range(0, body.shape[0] - width + 1, stride))
    if starts[-1] + width < body.shape[0]:
        starts.append(body.shape[0] - width)
    return [np.concatenate([ids[:1], body[s : s + width], ids[-1:]]) for s in starts]


def aggregate(probabilities: Sequence[float], lengths: Sequence[int], how: str) -> float:
    """Combine window probabilities of one text into one (see ``AGGREGATIONS``)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if how == "max":
        return float(p.max())
    if how == "mean":
        return float(p.mean())
    w = np.asarray(lengths, dtype=np.float64)
    return float((p * w).sum() / w.sum())


def logit(p: float) -> float:
    """Inverse sigmoid, with p clipped to [1e-12, 1 - 1e-12] so it stays finite."""
    p = min(max(p, 1e-12), 1.0 - 1e-12)
    return math.log(p) - math.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


@dataclass
class Work:
    """One request's validated input: ``texts`` (N strings) and ``thresholds`` (float32 [N])."""

    texts: List[str]
    thresholds: np.ndarray


@dataclass
class Result:
    """One request's answer: PROBABILITIES float32 [N, 1], VERDICTS bool [N, 1], ROUTE [N]."""

    probabilities: np.ndarray
    verdicts: np.ndarray
    routes: List[str]


# infer(model_name, inputs, parameters) -> outputs; raises DownstreamError.
InferFn = Callable[[str, Dict[str, np.ndarray], Optional[dict]], Awaitable[Dict[str, np.ndarray]]]


class Router:
    """The routing logic, independent of how BLS calls are made (``infer``)."""

    def __init__(self, settings: RouterSettings, infer: InferFn):
        self.settings = settings
        self.infer = infer

    async def _batched(self, model, rows, make_inputs, parameters=None):
        """Send ``rows`` to ``model`` in concurrent calls of at most ``bls_max_batch_size``."""
        size = self.settings.bls_max_batch_size
        parts = [rows[i : i + size] for i in range(0, len(rows), size)]
        return await asyncio.gather(*(self.infer(model, make_inputs(part), parameters) for part in parts))

    async def tokenize(self, texts: List[str]) -> List[np.ndarray]:
        """Whole-text token ids (no truncation), one int64 array per text."""

        def inputs(part):
            arr = np.array([t.encode("utf-8") for t in part], dtype=np.object_).reshape(-1, 1)
            return {"TEXT": arr}

        outs = await self._batched(self.settings.tokenizer_model, texts, inputs, {"truncation": False})
        result = []
        for out in outs:
            ids, mask = out["input_ids"], out["attention_mask"]
            lengths = mask.sum(axis=1)
            result.extend(ids[i, : int(lengths[i])] for i in range(ids.shape[0]))
        return result

    async def classify(self, model: str, sequences: List[np.ndarray]) -> np.ndarray:
        """Logits (float32 [len(sequences)]) of ``model`` for token sequences of any lengths.

        Sequences are sorted by length and each BLS call is padded to its own longest row.
        """
        if not sequences:
            return np.zeros(0, dtype=np.float32)
        order = sorted(range(len(sequences)), key=lambda i: sequences[i].shape[0])

        def inputs(part):
            width = max(sequences[i].shape[0] for i in part)
            ids = np.zeros((len(part), width), dtype=np.int64)
            mask = np.zeros((len(part), width), dtype=np.int64)
            for row, i in enumerate(part):
                n = sequences[i].shape[0]
                ids[row, :n] = sequences[i]
                mask[row, :n] = 1
            return {"input_ids": ids, "attention_mask": mask}

        outs = await self._batched(model, order, inputs)
        logits = np.empty(len(sequences), dtype=np.float32)
        logits[order] = np.concatenate([o["logits"].reshape(len(o["logits"]), -1)[:, 0] for o in outs])
        return logits

    async def run(self, works: List[Work]) -> List[Result]:
        """Answer every request in ``works``; raises DownstreamError if a BLS call fails."""
        s = self.settings
        texts = [t for w in works for t in w.texts]
        thresholds = np.concatenate([w.thresholds for w in works]).astype(np.float64) if works else np.zeros(0)
        probs = np.full(len(texts), EMPTY_PROBABILITY, dtype=np.float64)
        routes = [ROUTE_EMPTY] * len(texts)
        live = [i for i, t in enumerate(texts) if t.strip()]
        final_logits = {}

        if live:
            tokens = await self.tokenize([texts[i] for i in live])
            # items: (text index, token ids) rows sent to a classifier
            items: List[tuple] = []
            chunked = set()
            for i, ids in zip(live, tokens):
                pieces = token_windows(ids, s.max_sequence_length, s.chunk_stride)
                if len(pieces) > 1:
                    chunked.add(i)
                items.extend((i, piece) for piece in pieces)

            async def score(model, text_ids):
                wanted = set(text_ids)
                chosen = [(i, seq) for i, seq in items if i in wanted]
                logits = await self.classify(model, [seq for _, seq in chosen])
                per_text: Dict[int, list] = {}
                for (i, seq), z in zip(chosen, logits):
                    per_text.setdefault(i, []).append((float(z), seq.shape[0]))
                for i, vals in per_text.items():
                    if i in chunked:
                        window_probs = sigmoid(np.array([z for z, _ in vals]))
                        p = aggregate(window_probs, [n for _, n in vals], s.chunk_aggregation)
                        final_logits[i], probs[i] = logit(p), p
                    else:
                        final_logits[i], probs[i] = vals[0][0], float(sigmoid(vals[0][0]))
                    routes[i] = f"chunked:{model}" if i in chunked else model

            await score(s.fast_model, live)
            unsure = [i for i in live if abs(probs[i] - thresholds[i]) < s.cascade_margin]
            if unsure:
                await score(s.accurate_model, unsure)

            post = await self._batched(
                s.postprocess_model,
                live,
                lambda part: {
                    "logits": np.array([[final_logits[i]] for i in part], dtype=np.float32),
                    "THRESHOLD": thresholds[part].astype(np.float32).reshape(-1, 1),
                },
            )
            post_probs = np.concatenate([o["PROBABILITIES"].reshape(-1) for o in post])
            post_verdicts = np.concatenate([o["VERDICTS"].reshape(-1) for o in post])
            verdicts = np.zeros(len(texts), dtype=bool)
            probs[live], verdicts[live] = post_probs, post_verdicts
        else:
            verdicts = np.zeros(len(texts), dtype=bool)

        results, start = [], 0
        for w in works:
            end = start + len(w.texts)
            results.append(
                Result(
                    probabilities=probs[start:end].astype(np.float32).reshape(-1, 1),
                    verdicts=verdicts[start:end].reshape(-1, 1),
                    routes=routes[start:end],
                )
            )
            start = end
        return results


def parse_request(texts_array: Optional[np.ndarray], thresholds_array: Optional[np.ndarray]) -> Work:
    """Validate one request's ``TEXT`` and ``THRESHOLD``.

    Raises:
        InputError: a missing input, an empty batch, invalid UTF-8, or a threshold that is
            not one finite probability per text.
    """
    if texts_array is None:
        raise InputError("TEXT: required input is missing")
    if thresholds_array is None:
        raise InputError("THRESHOLD: required input is missing")
    texts = decode_texts(texts_array, "TEXT")
    return Work(texts=texts, thresholds=check_thresholds(thresholds_array, len(texts), "THRESHOLD"))


class TritonPythonModel:
    """Triton Python-backend adapter around :class:`Router` (BLS through ``async_exec``)."""

    def initialize(self, args):
        import json

        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.router = Router(RouterSettings.from_parameters(config_parameters(config)), self._infer)
        self.logger = pb_utils.Logger

    async def _infer(self, model: str, inputs: Dict[str, np.ndarray], parameters: Optional[dict] = None):
        pb = self.pb
        request = pb.InferenceRequest(
            model_name=model,
            inputs=[pb.Tensor(name, value) for name, value in inputs.items()],
            requested_output_names=[],
            parameters=parameters or {},
        )
        response = await request.async_exec()
        if response.has_error():
            raise DownstreamError(f"model '{model}' failed: {response.error().message()}")
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def _response(self, result: Result):
        pb = self.pb
        routes = np.array([r.encode("utf-8") for r in result.routes], dtype=np.object_).reshape(-1, 1)
        return pb.InferenceResponse(
            output_tensors=[
                pb.Tensor("PROBABILITIES", result.probabilities),
                pb.Tensor("VERDICTS", result.verdicts),
                pb.Tensor("ROUTE", routes),
            ]
        )

    async def execute(self, requests):
        from orchestrator.models._triton import error_response

        pb = self.pb
        responses = [None] * len(requests)
        works = {}
        for k, request in enumerate(requests):
            try:
                text = pb.get_input_tensor_by_name(request, "TEXT")
                thr = pb.get_input_tensor_by_name(request, "THRESHOLD")
                works[k] = parse_request(
                    None if text is None else text.as_numpy(), None if thr is None else thr.as_numpy()
                )
            except InputError as exc:
                responses[k] = error_response(f"router: {exc}", "INVALID_ARG")
        try:
            keys = list(works)
            for k, result in zip(keys, await self.router.run([works[k] for k in keys])):
                responses[k] = self._response(result)
        except DownstreamError as batch_error:
            # Retry each request alone so only the requests that fail get the error.
            for k in works:
                if len(works) == 1:
                    responses[k] = error_response(f"router: {batch_error}", "INTERNAL")
                    continue
                try:
                    responses[k] = self._response((await self.router.run([works[k]]))[0])
                except DownstreamError as exc:
                    responses[k] = error_response(f"router: {exc}", "INTERNAL")
        except Exception as exc:  # a bug must fail these requests, not the model instance
            self.logger.log_error(f"router: unexpected error: {traceback.format_exc()}")
            for k in works:
                responses[k] = error_response(f"router: internal error: {type(exc).__name__}: {exc}", "INTERNAL")
        return responses
