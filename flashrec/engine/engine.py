"""Engine assembly: tokenizer -> catalog -> SID layout -> trie -> model runner -> scheduler.

``Engine.generate`` runs requests to completion synchronously (offline CLI, tests); the
server drives the same scheduler from a background thread (``engine/loop.py``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import logging
import platform
import time
from collections.abc import Callable
from typing import Any

import torch

from flashrec import __version__, boundedread
from flashrec.config import EngineConfig, ModelConfig, env_flag
from flashrec.config.engine import DEFAULT_CATALOG
from flashrec.engine.request import GenRequest, GenResult, check_request_limits
from flashrec.engine.runner import ModelRunner
from flashrec.engine.scheduler import Scheduler
from flashrec.engine.weights import (
    StagedWeights,
    WeightsVersion,
    copy_weights,
    identify,
    tokenizer_files_digest,
    vocab_digest,
)
from flashrec.prompt import build_prompt_ids, load_tokenizer, share_word_cache
from flashrec.sid.catalog_set import CatalogSet, NamedCatalog
from flashrec.sid.layout import resolve_sid_layout
from flashrec.sid.version import CatalogVersion, build_catalog_version, unconstrained

log = logging.getLogger("flashrec")


def private_prompt_builder(
    tokenizer, model_path: str, layout, vocab_size: int
) -> Callable[..., list[int]]:
    """``build_prompt_ids`` over a private copy of ``tokenizer`` (loaded again from
    ``model_path`` where it cannot be copied), sharing its model and so its word-cache
    capacity (``prompt.bound_word_cache``); shared with the engine-process front end."""
    try:
        tok = copy.deepcopy(tokenizer)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be copied is loaded again
        tok = load_tokenizer(model_path)
    share_word_cache(tok, tokenizer)
    return functools.partial(build_prompt_ids, tok, layout, vocab_size)


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        if not config.model_path:
            raise ValueError("--model-path is required")
        self.config = config
        self.model_config = ModelConfig.from_path(config.model_path)
        self.tokenizer = load_tokenizer(config.model_path)
        # the layout comes from --sid or the tokenizer, not the catalog; the catalog is read
        # once, under it, as a hot reload reads one (a trailing end code dropped, packed keys
        # base --packed-base or 8192, never its codebook size, a depth beyond its levels refused)
        self.layout = resolve_sid_layout(self.tokenizer, config.sid)
        named = self._load_catalogs(config)
        self.depth = named[0][1].depth
        # the served catalogs by name, the first the default (a hot reload swaps one:
        # ``build_catalog`` + ``swap_catalog``; ``rollback_catalog`` returns to the last)
        self.catalogs = CatalogSet(named)
        version = self.catalog_version
        self.runner = ModelRunner(
            config, self.model_config, self.layout, self.depth, trie=version.trie
        )
        self.runner.step_catalog = version
        self.scheduler = Scheduler(self.runner, self.layout, self.catalogs, self.tokenizer)
        self.scheduler.debug_hash = env_flag("FLASHREC_DEBUG_STEP_HASH")
        self._ids = itertools.count()
        # the served weights' identity and what a weight update must match (engine/weights.py)
        self.weights: WeightsVersion = identify(config.model_path)
        self.vocab_digest = vocab_digest(self.tokenizer)
        self.tokenizer_files = tokenizer_files_digest(config.model_path)
        log.info("weights %s: hash %s", config.model_path, self.weights.hash)

    def _load_catalogs(self, config: EngineConfig) -> list[tuple[str, CatalogVersion]]:
        """Every ``--sid-vocab-file`` read and built (the first sets the depth the others must
        have); without one, the unconstrained search as the ``default`` catalog."""
        specs = config.catalog_specs
        if not specs:
            log.warning(
                "no --sid-vocab-file: decoding is unconstrained over the SID codebooks (smoke only)"
            )
            return [(DEFAULT_CATALOG, unconstrained(self.layout.num_levels))]
        # the layout comes from --sid or the tokenizer, not the catalog; a catalog is read
        # under it as a hot reload reads one (a trailing end code dropped, packed keys base
        # --packed-base or 8192, never its codebook size, a depth beyond its levels refused)
        named: list[tuple[str, CatalogVersion]] = []
        for name, path in specs:
            depth = named[0][1].depth if named else None
            with self.catalog_limits():
                version = build_catalog_version(
                    path, self.layout, depth, config.resolved_device, config.packed_base
                )
            log.info(
                "catalog %s (%s): %d SIDs, depth %d, hash %s, %.1f MiB on %s",
                name, path, version.size, version.depth, version.hash,
                version.trie.nbytes() / 2**20, config.resolved_device,
            )  # fmt: skip
            named.append((name, version))
        return named

    @property
    def catalog_version(self) -> CatalogVersion:
        """The default catalog's served version."""
        return self.catalogs.get(None)

    @property
    def trie(self):
        """The default catalog's trie (None: unconstrained)."""
        return self.catalog_version.trie

    # ---- catalog hot reload -------------------------------------------------------------
    def build_catalog(self, path: str, packed_base: int | None = None) -> CatalogVersion:
        """Load, validate and build ``path`` for this engine (any thread but the engine's:
        nothing the engine reads changes); ValueError when it cannot serve here. Packed keys
        decode base ``packed_base``, else ``--packed-base``, else RecIF's 8192."""
        base = packed_base if packed_base is not None else self.config.packed_base
        with self.catalog_limits():  # --max-catalog-bytes, --catalog-read-timeout-s
            return build_catalog_version(
                path, self.layout, self.depth, self.config.resolved_device, base
            )

    def catalog_limits(self) -> contextlib.AbstractContextManager:
        """Catalog reads on this thread, inside the block, are bounded by the configuration
        (a regular file of at most ``--max-catalog-bytes``, read within its timeout)."""
        return boundedread.using(self.config.max_catalog_bytes, self.config.catalog_read_timeout_s)

    def swap_catalog(self, version: CatalogVersion, name: str | None = None) -> float:
        """Make ``version`` catalog ``name``'s served one (None: the default's), keeping the
        one it replaces for a rollback (engine thread, between steps); returns the
        milliseconds it took. Running requests keep theirs."""
        t0 = time.perf_counter()
        if version.depth != self.depth:
            raise ValueError(f"catalog depth {version.depth} != the engine's {self.depth}")
        self._serve(self.catalogs.install(name, version))
        return (time.perf_counter() - t0) * 1e3

    def rollback_catalog(self, name: str | None = None) -> float:
        """Catalog ``name`` (None: the default) serves its previous version again (engine
        thread, between steps); NoPreviousCatalogError when it has none. Milliseconds taken."""
        t0 = time.perf_counter()
        self._serve(self.catalogs.rollback(name))
        return (time.perf_counter() - t0) * 1e3

    def _serve(self, entry: NamedCatalog) -> None:
        """After a swap of ``entry`` (requests admitted from now on take its served version,
        ``Scheduler.catalog_for``): the default's also becomes the static step's where no
        step graph captured the old one."""
        if entry.name == self.catalogs.default:
            self.runner.use_catalog(entry.current)

    def check_catalog_name(self, name: str | None) -> None:
        """UnknownCatalogError unless this engine holds catalog ``name`` (None: the default)."""
        self.catalogs.entry(name)

    # ---- weight update ------------------------------------------------------------------
    def swap_weights(self, staged: StagedWeights) -> float:
        """Copy ``staged`` into the served weights' own buffers and empty the radix cache (its
        KV was computed with the old weights); engine thread, with no request running. Returns
        the milliseconds it took."""
        t0 = time.perf_counter()
        if self.scheduler.running:
            raise RuntimeError("weights swapped while requests run")
        copy_weights(self.runner.model, staged)
        self.scheduler.flush_cache()
        self.weights = staged.version
        return (time.perf_counter() - t0) * 1e3

    # ---- prompts ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def max_beam_rows(self) -> int:
        return self.config.resolved_batch_slots

    def build_prompt(
        self,
        messages=None,
        text: str | None = None,
        input_ids=None,
        chat_template_kwargs: dict | None = None,
    ) -> list[int]:
        """See ``flashrec.prompt.build_prompt_ids``."""
        return build_prompt_ids(
            self.tokenizer,
            self.layout,
            self.vocab_size,
            messages=messages,
            text=text,
            input_ids=input_ids,
            chat_template_kwargs=chat_template_kwargs,
        )

    def sid_text_table(self) -> dict[int, str]:
        """Token id -> text of every SID token (what the beams' text is made of)."""
        return self.scheduler._text.table

    def prompt_builder(self) -> Callable[..., list[int]]:
        """``build_prompt`` over a private copy of the tokenizer, for one more prompt-building
        thread of the server (a HF fast tokenizer must not be used by two threads at once)."""
        return private_prompt_builder(
            self.tokenizer, self.config.model_path, self.layout, self.vocab_size
        )

    def prompt_builders(self, count: int) -> list[Callable[..., list[int]]]:
        """``count`` builders for as many threads: ``build_prompt``'s own, then copies."""
        own = functools.partial(build_prompt_ids, self.tokenizer, self.layout, self.vocab_size)
        return [own, *(self.prompt_builder() for _ in range(count - 1))]

    def new_request(
        self,
        input_ids: list[int],
        n: int | None = None,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        seed: int | None = None,
        rid: str | None = None,
        catalog: str | None = None,
    ) -> GenRequest:
        return GenRequest(
            rid or f"req-{next(self._ids)}",
            input_ids,
            n or self.config.beam_width,
            max_tokens or (self.depth + 1),
            temperature,
            seed,
            catalog=catalog,
        )

    # ---- offline execution --------------------------------------------------------------
    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Run ``requests`` to completion (batched continuously) and return results in order."""
        for r in requests:
            self.check_request(r)
            self.scheduler.add(r)
        done: dict[str, GenResult] = {}
        while self.scheduler.has_work():
            for req, res in self.scheduler.step():
                if isinstance(res, Exception):
                    raise res
                done[req.rid] = res
        return [done[r.rid] for r in requests]

    def check_request(self, r: GenRequest) -> None:
        """ValueError for a request this engine can never serve."""
        check_request_limits(
            r, self.max_beam_rows, self.config.max_seq_len, self.runner.kv.pool_tokens
        )
        self.check_catalog_name(r.catalog)

    def server_info(self) -> dict[str, Any]:
        import dataclasses

        info = {
            "version": __version__,
            "config": dataclasses.asdict(self.config),
            "model": dataclasses.asdict(self.model_config),
            "sid_layout": {
                "arg": self.layout.to_arg(),
                "code_start": self.layout.code_start,
                "codebook_size": self.layout.codebook_size,
                "num_levels": self.layout.num_levels,
                "sid_begin": self.layout.sid_begin,
                "sid_end": self.layout.sid_end,
            },
            "catalog": self.catalog_version.info(),
            "catalogs": self.catalogs.info(),
            "weights": self.weights.info(),
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype),
            "fp8": self.runner.use_fp8,
            "kv_cache_dtype": str(self.runner.kv.dtype),
            "kv_pool_tokens": self.runner.kv.pool_tokens,
            "batch_slots": self.max_beam_rows,
            "attention_backend": self.runner.attention_backend,
            "decode_prompt_attention": self.runner.decode_prompt_attention,
            "effective": self._effective(),
            "versions": {"torch": torch.__version__, "python": platform.python_version()},
        }
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        return info

    def _effective(self) -> dict[str, Any]:
        """What the auto / default knobs resolved to on this device: whether CUDA graphs were
        captured and at which sizes, the whole-step decode graph, both prefill graph kinds'
        largest buckets (the piecewise one may have shrunk to fit the KV pool) and how many
        decode positions a beam reorder moves."""
        run = self.runner
        graphs = run.graphs
        return {
            "cuda_graphs": graphs is not None,
            "decode_graph_sizes": list(graphs.sizes) if graphs is not None else [],
            # on CPU the static step runs eagerly: "on" with no graph sizes
            "step_graph": run.step is not None,
            "step_graph_sizes": list(graphs.step_sizes) if graphs is not None else [],
            "prefill_graph_max_tokens": run.prefill_graphs.sizes[-1] if run.prefill_graphs else 0,
            "piecewise_prefill_max_tokens": run.piecewise.sizes[-1] if run.piecewise else 0,
            "kv_reorder_positions": run.kv.reorder_positions,
            "overlap_results": self.scheduler.overlap_results,
        }
