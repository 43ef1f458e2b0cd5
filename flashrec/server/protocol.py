"""Request parsing and validation for the two wire protocols (OpenAI chat, SGLang /generate).

Parsing is pure: a JSON body plus the server's :class:`Limits` in, a frozen request record
out, or an :class:`~flashrec.server.errors.APIError` (400) naming the offending field.
Checks that need the tokenized prompt (length, vocabulary) are :func:`check_prompt`. Either
record gives the request path its prompts to build (``prompt_inputs``), its sampling
``params`` and the prefix of its engine requests' ids.

Rules shared by both protocols:

- unknown fields are ignored;
- integers must be JSON integers (``true`` is not ``1``, ``2.0`` is not ``2``);
- ``n`` must lie in ``[1, max_beam_rows]``, ``max_tokens`` in ``[1, max_seq_len]``,
  ``temperature`` in ``[0, MAX_TEMPERATURE]`` (float32's largest finite value: the engine holds
  it as a float32 tensor), ``seed`` in ``[0, 2**63)`` (an int64 tensor);
- ``catalog`` (ours: top level in chat, in ``sampling_params`` of ``/generate``) must name a
  catalog the server holds (``--sid-vocab-file NAME=PATH``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from flashrec.config.engine import unknown_catalog
from flashrec.engine.request import MAX_SEED, MAX_TEMPERATURE
from flashrec.server.errors import bad_request

# apply_chat_template parameters a client must not set through chat_template_kwargs: they
# would swap the template, change the output type, or touch the shared tokenizer's state.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "conversation",
        "max_length",
        "messages",
        "padding",
        "processor_kwargs",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "tokenize",
        "tokenizer_kwargs",
        "truncation",
    }
)


@dataclass(frozen=True)
class Limits:
    """What the engine accepts; request values outside these are a 400."""

    max_beam_rows: int
    vocab_size: int
    max_seq_len: int
    default_n: int
    default_max_tokens: int
    max_batch: int = 1024
    catalogs: tuple[str, ...] = ("default",)  # the catalog names a request may pick


@dataclass(frozen=True)
class SamplingParams:
    """Beam-search parameters of one request, after defaults."""

    n: int  # beams searched (the beam width)
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    num_return: int | None = None  # /generate: the best beams returned (None: all n)
    catalog: str | None = None  # the named catalog it decodes over (None: the default)


@dataclass(frozen=True)
class PromptInput:
    """One prompt to build: a prompt builder's keywords, and the request field a
    prompt that cannot be built is a 400 on."""

    param: str
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body."""

    messages: list[dict[str, Any]]
    params: SamplingParams
    stream: bool = False
    model: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    rid_prefix: ClassVar[str] = "chatcmpl-"  # its engine request's id: the completion's id

    def prompt_inputs(self) -> list[PromptInput]:
        kwargs = {"messages": self.messages, "chat_template_kwargs": self.chat_template_kwargs}
        return [PromptInput("messages", kwargs)]


@dataclass(frozen=True)
class Prompt:
    """One /generate prompt: raw ``text`` or token ``input_ids`` (exactly one is set)."""

    text: str | None = None
    input_ids: list[int] | None = None


@dataclass(frozen=True)
class GenerateRequest:
    """A validated ``POST /generate`` body; ``batched`` when the input was a list."""

    prompts: list[Prompt]
    params: SamplingParams
    batched: bool = False
    stream: bool = False
    rid_prefix: ClassVar[str] = ""

    def prompt_inputs(self) -> list[PromptInput]:
        out = []
        for i, prompt in enumerate(self.prompts):
            if prompt.input_ids is not None:
                param, kwargs = "input_ids", {"input_ids": prompt.input_ids}
            else:
                param, kwargs = "text", {"text": prompt.text}
            out.append(PromptInput(f"{param}[{i}]" if self.batched else param, kwargs))
        return out


# -- typed field readers ---------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def get_int(body: Mapping[str, Any], key: str, param: str, lo: int, hi: int) -> int | None:
    """``body[key]`` as an int in ``[lo, hi]``; ``None`` when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise bad_request(f"'{param}' must be an integer, got {type(v).__name__}", param)
    if not lo <= v <= hi:
        raise bad_request(f"'{param}' must be in [{lo}, {hi}], got {v}", param)
    return v


def get_float(
    body: Mapping[str, Any], key: str, param: str, hi: float = math.inf, why: str = ""
) -> float | None:
    """``body[key]`` as a finite float in ``[0, hi]`` (``why``: the reason for ``hi``, for the
    message); ``None`` when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise bad_request(f"'{param}' must be a number, got {type(v).__name__}", param)
    try:
        f = float(v)
    except OverflowError:
        raise bad_request(f"'{param}' must be a finite number", param) from None
    if not math.isfinite(f):
        raise bad_request(f"'{param}' must be a finite number, got {v}", param)
    if f < 0:
        raise bad_request(f"'{param}' must be >= 0, got {v}", param)
    if f > hi:
        raise bad_request(f"'{param}' must be at most {hi:g}{why}, got {v}", param)
    return f


def get_bool(body: Mapping[str, Any], key: str, param: str) -> bool:
    """``body[key]`` as a bool; absent or null is ``False``."""
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad_request(f"'{param}' must be a boolean, got {type(v).__name__}", param)
    return v


def get_str(body: Mapping[str, Any], key: str, param: str) -> str | None:
    """``body[key]`` as a string; ``None`` when absent or null."""
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        raise bad_request(f"'{param}' must be a string, got {type(v).__name__}", param)
    return v


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    """``body`` if it is a JSON object, else 400."""
    if not isinstance(body, dict):
        raise bad_request(f"{what} must be a JSON object, got {_json_type(body)}")
    return body


def _json_type(v: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(v), "number")


def sampling_params(
    body: Mapping[str, Any],
    limits: Limits,
    n_keys: tuple[str, ...],
    max_keys: tuple[str, ...],
    seed_keys: tuple[str, ...],
    prefix: str = "",
) -> SamplingParams:
    """Read n / max_tokens / temperature / seed; the first present key of each tuple wins."""

    def first(keys: tuple[str, ...], lo: int, hi: int) -> int | None:
        for key in keys:
            v = get_int(body, key, prefix + key, lo, hi)
            if v is not None:
                return v
        return None

    n = first(n_keys, 1, limits.max_beam_rows)
    max_tokens = first(max_keys, 1, limits.max_seq_len)
    seed = first(seed_keys, 0, MAX_SEED - 1)
    temperature = get_float(
        body, "temperature", prefix + "temperature", MAX_TEMPERATURE, " (the largest float32)"
    )
    catalog = get_str(body, "catalog", prefix + "catalog")
    if catalog is not None and catalog not in limits.catalogs:
        raise bad_request(unknown_catalog(catalog, limits.catalogs), prefix + "catalog")
    return SamplingParams(
        n=limits.default_n if n is None else n,
        max_tokens=limits.default_max_tokens if max_tokens is None else max_tokens,
        temperature=0.0 if temperature is None else temperature,
        seed=seed,
        catalog=catalog,
    )


# -- OpenAI chat -----------------------------------------------------------------------------


def _message_content(content: Any, param: str) -> str | list[dict[str, str]]:
    """A message ``content``: a string, or a list of ``{"type": "text", "text": ...}`` parts
    (passed to the engine as parts; ``Engine.build_prompt`` joins them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(
            f"'{param}' must be a string or a list of text parts, got {_json_type(content)}", param
        )
    texts = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise bad_request(f"'{p}' must be an object, got {_json_type(part)}", p)
        if part.get("type") != "text":
            raise bad_request(f"'{p}.type' must be 'text' (only text content is supported)", p)
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"'{p}.text' must be a string", p + ".text")
        texts.append({"type": "text", "text": text})
    return texts


def parse_messages(raw: Any) -> list[dict[str, Any]]:
    """``messages`` as a non-empty list of ``{"role", "content"}`` (other keys dropped)."""
    if raw is None:
        raise bad_request("'messages' is required", "messages")
    if not isinstance(raw, list):
        raise bad_request(f"'messages' must be an array, got {_json_type(raw)}", "messages")
    if not raw:
        raise bad_request("'messages' must not be empty", "messages")
    out = []
    for i, msg in enumerate(raw):
        p = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise bad_request(f"'{p}' must be an object, got {_json_type(msg)}", p)
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(f"'{p}.role' must be a non-empty string", p + ".role")
        if msg.get("content") is None:
            raise bad_request(f"'{p}.content' is required", p + ".content")
        out.append({"role": role, "content": _message_content(msg["content"], p + ".content")})
    return out


def parse_chat(body: Any, limits: Limits) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body (see the module docstring for the rules)."""
    body = require_object(body)
    messages = parse_messages(body.get("messages"))
    params = sampling_params(
        body, limits, ("n",), ("max_completion_tokens", "max_tokens"), ("seed",)
    )
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs or {}))
    if reserved:
        raise bad_request(
            f"'chat_template_kwargs' may not set {reserved} (template variables only)",
            "chat_template_kwargs",
        )
    return ChatRequest(
        messages=messages,
        params=params,
        stream=get_bool(body, "stream", "stream"),
        model=get_str(body, "model", "model"),
        chat_template_kwargs=kwargs or None,
    )


# -- SGLang /generate ------------------------------------------------------------------------


def _token_list(raw: Any, param: str, vocab_size: int) -> list[int]:
    if not isinstance(raw, list):
        raise bad_request(f"'{param}' must be an array of token ids", param)
    if not raw:
        raise bad_request(f"'{param}' must not be empty", param)
    for j, tok in enumerate(raw):
        if not _is_int(tok):
            raise bad_request(f"'{param}[{j}]' must be an integer token id", param)
        if not 0 <= tok < vocab_size:
            raise bad_request(
                f"'{param}[{j}]' = {tok} is outside the vocabulary [0, {vocab_size})", param
            )
    return list(raw)


def _prompts(body: Mapping[str, Any], limits: Limits) -> tuple[list[Prompt], bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise bad_request("exactly one of 'text' and 'input_ids' is required", "text")
    if text is not None:
        batched = isinstance(text, list)
        texts = text if batched else [text]
        for i, t in enumerate(texts):
            p = f"text[{i}]" if batched else "text"
            if not isinstance(t, str):
                raise bad_request(f"'{p}' must be a string, got {_json_type(t)}", p)
            if not t:
                raise bad_request(f"'{p}' must not be empty", p)
        prompts = [Prompt(text=t) for t in texts]
    else:
        batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        lists = ids if batched else [ids]
        prompts = [
            Prompt(
                input_ids=_token_list(
                    x, f"input_ids[{i}]" if batched else "input_ids", limits.vocab_size
                )
            )
            for i, x in enumerate(lists)
        ]
    if not prompts:
        raise bad_request(
            "the prompt list must not be empty", "input_ids" if text is None else "text"
        )
    if len(prompts) > limits.max_batch:
        raise bad_request(f"at most {limits.max_batch} prompts per request", "text")
    return prompts, batched


def parse_generate(body: Any, limits: Limits) -> GenerateRequest:
    """Validate a ``/generate`` body with SGLang's beam semantics: ``beam_width`` beams are
    searched and the best ``n`` returned (``n`` defaults to 1 as upstream, ``n > beam_width``
    is a 400). Without ``beam_width``, ``n`` is the beam width and every beam is returned
    (ours: upstream would sample ``n`` times)."""
    body = require_object(body)
    prompts, batched = _prompts(body, limits)
    sp = body.get("sampling_params")
    sp = {} if sp is None else require_object(sp, "'sampling_params'")
    params = sampling_params(
        sp,
        limits,
        ("beam_width", "n"),
        ("max_new_tokens",),
        ("seed", "sampling_seed"),
        prefix="sampling_params.",
    )
    if sp.get("beam_width") is not None:
        n = get_int(sp, "n", "sampling_params.n", 1, limits.max_beam_rows)
        n = 1 if n is None else n
        if n > params.n:
            raise bad_request(
                f"'sampling_params.n' ({n}) cannot exceed 'sampling_params.beam_width' "
                f"({params.n})",
                "sampling_params.n",
            )
        params = replace(params, num_return=n)
    return GenerateRequest(
        prompts=prompts, params=params, batched=batched, stream=get_bool(body, "stream", "stream")
    )


def check_prompt(input_ids: list[int], limits: Limits, param: str) -> None:
    """400 unless the built prompt fits ``max_seq_len`` and every id is in the vocabulary."""
    if len(input_ids) > limits.max_seq_len:
        raise bad_request(
            f"the prompt has {len(input_ids)} tokens; the server accepts at most "
            f"{limits.max_seq_len} (--max-seq-len)",
            param,
        )
    if input_ids and 0 <= min(input_ids) and max(input_ids) < limits.vocab_size:
        return  # the common case, without a Python-level loop over the prompt
    for tok in input_ids:
        if not 0 <= tok < limits.vocab_size:
            raise bad_request(f"token id {tok} is outside the vocabulary", param)
