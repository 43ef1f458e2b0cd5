"""HF transformers reference: ``generate(num_beams=n)`` with a LogitsProcessor that applies the
engine's logprob-scope normalisation and then the catalog constraint (in that order).

The catalog constraint here is a plain dict of prefixes built from the catalog codes: it is
deliberately independent of ``flashrec.sid.trie`` so that parity also checks the trie.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashrec.config import ModelConfig
from flashrec.prompt import build_prompt_ids
from flashrec.sid.catalog import load_catalog
from flashrec.sid.layout import SidLayout, resolve_sid_layout


def resolve_prefill_chunk(chunk: int | None, device: str, dtype: torch.dtype) -> int:
    """Prompt tokens per prefill forward of ``generate`` (HF's ``prefill_chunk_size``; 0 = the
    whole prompt at once). ``None`` picks 512 for float32 on CUDA: there HF's SDPA call with
    grouped KV heads falls back to the math kernel, which holds beams x heads x prompt^2 scores
    (tens of GiB at 256 beams of a long prompt); in chunks, a chunk's rows only."""
    if chunk is None:
        chunk = 512 if device == "cuda" and dtype == torch.float32 else 0
    if chunk < 0:
        raise ValueError(f"prefill_chunk must be >= 0, got {chunk}")
    if chunk:
        from transformers import GenerationConfig

        if not hasattr(GenerationConfig(), "prefill_chunk_size"):
            raise ValueError(
                "this transformers has no chunked prefill (prefill_chunk_size); pass 0"
            )
    return chunk


def _prefix_table(codes: np.ndarray) -> dict[tuple[int, ...], list[int]]:
    table: dict[tuple[int, ...], set[int]] = {}
    for row in codes.tolist():
        for level in range(len(row)):
            table.setdefault(tuple(row[:level]), set()).add(row[level])
    return {k: sorted(v) for k, v in table.items()}


class ScopeCatalogProcessor:
    """Called by HF with the running sequences and the step's full-vocab log-probs."""

    def __init__(
        self, layout: SidLayout, scope: str, prompt_len: int, depth: int, prefixes: dict | None
    ) -> None:
        self.layout, self.scope, self.prompt_len, self.depth = layout, scope, prompt_len, depth
        self.prefixes = prefixes

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        level = input_ids.shape[1] - self.prompt_len
        lay = self.layout
        if level < self.depth:
            lo, hi = lay.level_range(level)
        else:
            lo, hi = lay.sid_end, lay.sid_end + 1
        s = scores.float()
        if self.scope == "level":
            part = torch.log_softmax(s[:, lo:hi], dim=-1)
        elif self.scope == "sid":
            a, b = lay.sid_range
            part = torch.log_softmax(s[:, a:b], dim=-1)[:, lo - a : hi - a]
        else:
            part = torch.log_softmax(s, dim=-1)[:, lo:hi]
        out = torch.full_like(s, float("-inf"))
        out[:, lo:hi] = part
        if self.prefixes is not None and level < self.depth:
            mask = torch.zeros_like(part, dtype=torch.bool)
            for r in range(input_ids.shape[0]):
                gen = input_ids[r, self.prompt_len :].tolist()
                prefix = tuple(t - lay.level_range(i)[0] for i, t in enumerate(gen))
                allowed = self.prefixes.get(prefix)
                if allowed:
                    mask[r, allowed] = True
            out[:, lo:hi] = part.masked_fill(~mask, float("-inf"))
        return out.to(scores.dtype)


@dataclass
class RefBeam:
    token_ids: list[int]
    sequence_score: float
    text: str


class HFReference:
    """HF beam search with the engine's prompt construction, scope and catalog constraint."""

    def __init__(
        self,
        model_path: str,
        sid_vocab_file: str | None = None,
        sid: str | None = None,
        logprob_scope: str = "level",
        length_penalty: float = 1.0,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        prefill_chunk: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        self.vocab_size = ModelConfig.from_path(model_path).vocab_size
        catalog = load_catalog(sid_vocab_file) if sid_vocab_file else None
        self.layout = resolve_sid_layout(self.tokenizer, sid, catalog.depth if catalog else None)
        if catalog is not None:
            catalog = load_catalog(sid_vocab_file, layout=self.layout)
        self.depth = catalog.depth if catalog is not None else self.layout.num_levels
        self.prefixes = _prefix_table(catalog.codes) if catalog is not None else None
        self.scope, self.length_penalty, self.device = logprob_scope, length_penalty, device
        self.prefill_chunk = resolve_prefill_chunk(prefill_chunk, device, dtype)

    def build_prompt(self, **kwargs) -> list[int]:
        return build_prompt_ids(self.tokenizer, self.layout, self.vocab_size, **kwargs)

    @torch.inference_mode()
    def generate(
        self, input_ids: list[int], n: int, max_tokens: int | None = None
    ) -> list[RefBeam]:
        from transformers import LogitsProcessorList

        max_new = min(self.depth + 1, max_tokens or self.depth + 1)
        proc = ScopeCatalogProcessor(
            self.layout, self.scope, len(input_ids), self.depth, self.prefixes
        )
        out = self.model.generate(
            torch.tensor([input_ids], device=self.device),
            attention_mask=torch.ones(1, len(input_ids), dtype=torch.long, device=self.device),
            num_beams=n,
            num_return_sequences=n,
            max_new_tokens=max_new,
            min_new_tokens=0,
            do_sample=False,
            length_penalty=self.length_penalty,
            eos_token_id=self.layout.sid_end,
            pad_token_id=self.layout.sid_end,
            logits_processor=LogitsProcessorList([proc]),
            output_scores=True,
            return_dict_in_generate=True,
            **({"prefill_chunk_size": self.prefill_chunk} if self.prefill_chunk else {}),
        )
        scores = getattr(out, "sequences_scores", None)
        if scores is None:  # n == 1: HF runs greedy search; score from the processed step scores
            gen = out.sequences[0, len(input_ids) :]
            cum = sum(float(s[0, t]) for s, t in zip(out.scores, gen.tolist()))
            scores = torch.tensor([cum / (len(gen) ** self.length_penalty)])
        beams = []
        for seq, score in zip(out.sequences.tolist(), scores.tolist()):
            if not np.isfinite(score) or score < -1e8:
                continue  # catalog had fewer continuations than n: HF pads with dead beams
            gen = seq[len(input_ids) :]
            if self.layout.sid_end in gen:
                gen = gen[: gen.index(self.layout.sid_end) + 1]
            beams.append(
                RefBeam(gen, float(score), self.tokenizer.decode(gen, skip_special_tokens=False))
            )
        beams.sort(key=lambda b: -b.sequence_score)
        return beams
