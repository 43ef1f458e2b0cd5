"""HF transformers reference: ``generate(num_beams=n)`` with a LogitsProcessor that applies the
engine's logprob-scope normalisation and then the catalog constraint (in that order), or the
same beam search over one shared prompt prefill (``search="shared"``, see ``resolve_search``).

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


SEARCHES = ("generate", "shared")
# prompt-plus-suffix KV rows per decode forward of the shared search: bounds the beams' copies
# of the prompt's cache that one forward holds (65,536 rows of a float32 1.7B model ~ 15 GiB)
_SHARED_KV_ROWS = 1 << 16


def resolve_search(search: str | None, device: str, dtype: torch.dtype) -> str:
    """How the reference runs beam search. ``generate``: HF's ``generate(num_beams=n)``, which
    copies the prompt into every beam before the prefill. ``shared``: the prompt prefilled once,
    its KV cache shared by the beams, then HF's per-step rule (log-softmax of float32 logits,
    the processor, running score plus top-n, score / generated length ** length_penalty) on the
    same HF forwards. ``None`` picks ``shared`` for float32 on CUDA, where n copies of a long
    prompt's float32 cache outgrow the GPU (256 beams of ~900 tokens ~ 50 GiB, twice while HF
    reorders it) and the prefill costs n prompts; elsewhere ``generate``."""
    if search is None:
        search = "shared" if device == "cuda" and dtype == torch.float32 else "generate"
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    return search


def _layer_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of an HF DynamicCache, [rows, kv heads, positions, head dim]."""
    if hasattr(cache, "layers"):  # transformers >= 4.56
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _forward_kwargs(model) -> tuple[str, bool]:
    """The cache argument's name of this transformers' forward (``cache`` in newer releases,
    ``past_key_values`` before) and whether it takes ``logits_to_keep``."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params


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
        return self.constrain(input_ids[:, self.prompt_len :].tolist(), scores)

    def constrain(self, gens: list[list[int]], scores: torch.FloatTensor) -> torch.FloatTensor:
        """Scores of the next token for rows whose generated tokens so far are ``gens``."""
        level = len(gens[0]) if gens else 0
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
            for r, gen in enumerate(gens):
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
        search: str | None = None,
        packed_base: int | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        self.vocab_size = ModelConfig.from_path(model_path).vocab_size
        # the layout comes from --sid or the tokenizer; the catalog is read once, under it (a
        # trailing end code dropped, packed keys base packed_base (default 8192, never the
        # codebook size), depth checked), as the engine reads it
        self.layout = resolve_sid_layout(self.tokenizer, sid)
        catalog = (
            load_catalog(sid_vocab_file, layout=self.layout, packed_base=packed_base)
            if sid_vocab_file
            else None
        )
        self.depth = catalog.depth if catalog is not None else self.layout.num_levels
        self.prefixes = _prefix_table(catalog.codes) if catalog is not None else None
        self.scope, self.length_penalty, self.device = logprob_scope, length_penalty, device
        self.prefill_chunk = resolve_prefill_chunk(prefill_chunk, device, dtype)
        self.search = resolve_search(search, device, dtype)
        self._cache_arg, self._keeps_logits = _forward_kwargs(self.model)

    def build_prompt(self, **kwargs) -> list[int]:
        return build_prompt_ids(self.tokenizer, self.layout, self.vocab_size, **kwargs)

    @torch.inference_mode()
    def generate(
        self, input_ids: list[int], n: int, max_tokens: int | None = None
    ) -> list[RefBeam]:
        max_new = min(self.depth + 1, max_tokens or self.depth + 1)
        proc = ScopeCatalogProcessor(
            self.layout, self.scope, len(input_ids), self.depth, self.prefixes
        )
        if self.search == "shared":
            gens, scores = self._shared_search(input_ids, n, max_new, proc)
        else:
            gens, scores = self._hf_generate(input_ids, n, max_new, proc)
        beams = []
        for gen, score in zip(gens, scores):
            if not np.isfinite(score) or score < -1e8:
                continue  # catalog had fewer continuations than n: HF pads with dead beams
            if self.layout.sid_end in gen:
                gen = gen[: gen.index(self.layout.sid_end) + 1]
            beams.append(
                RefBeam(gen, float(score), self.tokenizer.decode(gen, skip_special_tokens=False))
            )
        beams.sort(key=lambda b: -b.sequence_score)
        return beams

    def _hf_generate(
        self, input_ids: list[int], n: int, max_new: int, proc: ScopeCatalogProcessor
    ) -> tuple[list[list[int]], list[float]]:
        """HF's own beam search (greedy at n=1): generated tokens and scores per sequence."""
        from transformers import LogitsProcessorList

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
        return [seq[len(input_ids) :] for seq in out.sequences.tolist()], scores.tolist()

    def _shared_search(
        self, input_ids: list[int], n: int, max_new: int, proc: ScopeCatalogProcessor
    ) -> tuple[list[list[int]], list[float]]:
        """Beam search over one prefill of the prompt (see ``resolve_search``): each step's
        forward feeds every live beam its last token over the prompt's cache (expanded, in
        chunks of at most ``_SHARED_KV_ROWS`` cache rows) plus the beam's own earlier tokens."""
        from transformers import DynamicCache

        dev, plen = self.device, len(input_ids)
        prompt = torch.tensor([input_ids], device=dev)
        last_only = {"logits_to_keep": 1} if self._keeps_logits else {}
        cache = DynamicCache()
        step_len = self.prefill_chunk or plen
        for a in range(0, plen, step_len):
            out = self.model(
                input_ids=prompt[:, a : a + step_len],
                use_cache=True,
                **{self._cache_arg: cache},
                **last_only,
            )
        prompt_kv = _layer_kv(cache)
        logits = out.logits[:, -1, :].float()
        del out, cache
        gens: list[list[int]] = [[]]
        running = torch.zeros(1, device=dev)
        suffix: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # beams' own tokens' KV
        for step in range(max_new):
            if step:
                logits, suffix = self._beam_step(prompt_kv, suffix, gens, plen)
            log_probs = proc.constrain(gens, torch.log_softmax(logits, dim=-1))
            total = (log_probs + running[:, None]).reshape(-1)
            top = torch.topk(total, k=min(n, total.numel()))
            alive = torch.isfinite(top.values)  # a catalog with fewer continuations than n
            values, flat = top.values[alive], top.indices[alive]
            if not len(flat):
                return [], []
            vocab = logits.shape[-1]
            parents, tokens = (flat // vocab).tolist(), (flat % vocab).tolist()
            gens = [gens[p] + [t] for p, t in zip(parents, tokens)]
            running = values
            if suffix is not None:
                idx = torch.tensor(parents, device=dev)
                suffix = [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in suffix]
            if tokens and all(t == self.layout.sid_end for t in tokens):
                break  # every beam ended (the SID end token is the only one after the last level)
        lengths = torch.tensor([len(g) for g in gens], device=dev, dtype=torch.float32)
        scores = running / lengths**self.length_penalty
        return gens, scores.tolist()

    def _beam_step(
        self,
        prompt_kv: list[tuple[torch.Tensor, torch.Tensor]],
        suffix: list[tuple[torch.Tensor, torch.Tensor]] | None,
        gens: list[list[int]],
        plen: int,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Next-token float32 logits of every beam and the beams' own KV with their last token."""
        from transformers import DynamicCache

        last = torch.tensor([g[-1] for g in gens], device=self.device)[:, None]
        done = len(gens[0]) - 1  # the beams' tokens already in ``suffix``
        rows = max(1, _SHARED_KV_ROWS // (plen + done + 1))
        logits, parts = [], []
        for a in range(0, len(gens), rows):
            b = min(a + rows, len(gens))
            cache = DynamicCache()
            for layer, (pk, pv) in enumerate(prompt_kv):
                k, v = pk.expand(b - a, -1, -1, -1), pv.expand(b - a, -1, -1, -1)
                if suffix is not None:
                    k = torch.cat([k, suffix[layer][0][a:b]], dim=2)
                    v = torch.cat([v, suffix[layer][1][a:b]], dim=2)
                cache.update(k, v, layer)
            out = self.model(input_ids=last[a:b], use_cache=True, **{self._cache_arg: cache})
            logits.append(out.logits[:, -1, :].float())
            # copies, not views: a view would keep this chunk's whole cache alive
            parts.append(
                [
                    (k[:, :, plen:].contiguous(), v[:, :, plen:].contiguous())
                    for k, v in _layer_kv(cache)
                ]
            )
            del out, cache
        joined = [
            (torch.cat([p[i][0] for p in parts]), torch.cat([p[i][1] for p in parts]))
            for i in range(len(prompt_kv))
        ]
        return torch.cat(logits), joined
