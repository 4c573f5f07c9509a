"""The ``tokenizer`` model: ``TEXT`` to ``input_ids`` and ``attention_mask``.

Inputs and outputs (full shapes, batch first):
    TEXT            TYPE_STRING [N, 1]  UTF-8 texts
    input_ids       TYPE_INT64  [N, L]  token ids, right-padded with the pad id
    attention_mask  TYPE_INT64  [N, L]  1 for real tokens, 0 for padding

The tokenizer files (``tokenizer.json``, ``tokenizer_config.json``, ...) are read from the
model's version directory with :class:`orchestrator.runtime.execution.tokenize.TextTokenizer` (the
``tokenizers`` library; the ids ``transformers.AutoTokenizer`` gives); lower-casing, the
truncation length (``model_max_length``), sides and pad token come from those files.

Config parameters (``config.pbtxt``):
    padding     ``longest`` (default): pad to the longest text of the request;
                ``max_length``: pad to ``max_length`` tokens (the seeds' fixed 512).
    max_length  pad length for ``max_length`` padding (default 512).

Request parameter (KServe v2 ``parameters``):
    truncation  ``false`` turns truncation off so a caller (the router) sees whole texts;
                default ``true``: truncate to ``model_max_length``.

Errors (per request, INVALID_ARG): invalid UTF-8, empty batch, bad parameters. The load
fails (``ValueError``) without ``tokenizer.json`` (re-export with ``orchestrator export``),
without a pad token, or with bad padding parameters.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import triton_python_backend_utils as pb_utils
from numpy.typing import NDArray

from orchestrator.runtime.execution.tokenize import TextTokenizer, TokenizerFilesError
from orchestrator.runtime.models._triton import error_response, model_config, model_directory
from orchestrator.runtime.request import (
    InputError,
    config_parameters,
    decode_texts,
    parse_bool,
    request_parameters,
)

PADDING_MODES = ("longest", "max_length")


class TritonPythonModel:
    """The tokenizer model (see the module docstring)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Load the tokenizer files and check the padding parameters (ValueError: no
        ``tokenizer.json``, no pad token, bad parameters)."""
        params = config_parameters(model_config(args))
        try:
            self.tokenizer = TextTokenizer(model_directory(args))
        except TokenizerFilesError as exc:
            raise ValueError(f"tokenizer: {exc}") from None
        if self.tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer: {self.tokenizer.directory}: the files name no pad token, so batches "
                             "cannot be padded; set pad_token in tokenizer_config.json")
        self.padding = params.get("padding", "longest")
        if self.padding not in PADDING_MODES:
            raise ValueError(f"tokenizer: parameter padding={self.padding!r}, expected one of {PADDING_MODES}")
        self.max_length = int(params.get("max_length", "512"))
        self.truncation_length = int(self.tokenizer.model_max_length)
        if self.padding == "max_length" and self.max_length < self.truncation_length:
            raise ValueError(
                f"tokenizer: max_length={self.max_length} is shorter than model_max_length={self.truncation_length}"
            )

    def encode(self, texts: List[str], truncation: bool = True) -> Tuple[NDArray[Any], NDArray[Any]]:
        """Tokenize ``texts`` into int64 arrays ``(input_ids, attention_mask)``, shape [N, L]
        (L: the longest text's tokens, at least ``max_length`` with ``max_length`` padding)."""
        seqs = self.tokenizer.encode(texts, truncation)
        return self.tokenizer.pad(seqs, self.max_length if self.padding == "max_length" else 0)

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request: ids and mask, or an INVALID_ARG error naming the input."""
        responses = []
        for request in requests:
            try:
                texts = decode_texts(pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy())
                params = request_parameters(request.parameters())
                truncation = parse_bool(params.get("truncation", True), "truncation")
                input_ids, attention_mask = self.encode(texts, truncation)
            except InputError as exc:
                responses.append(error_response(f"tokenizer: {exc}"))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("input_ids", input_ids),
                        pb_utils.Tensor("attention_mask", attention_mask),
                    ]
                )
            )
        return responses
