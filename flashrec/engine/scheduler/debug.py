"""Step hashes for determinism debugging (``FLASHREC_DEBUG_STEP_HASH=1``), as the scheduler's
managers record them."""

from __future__ import annotations

import logging

import torch

from flashrec.engine.scheduler.state import ReqState
from flashrec.engine.stephash import StepHasher, hash_tensors

log = logging.getLogger("flashrec")


class StepDebug:
    """``on``: log one STEP_HASH line per request and step; ``hasher`` (None while off)
    fingerprints the forwards' inputs. Off, it costs one attribute read per batch."""

    def __init__(self, kv) -> None:
        self.kv = kv
        self.on = False
        self._hasher: StepHasher | None = None

    @property
    def hasher(self) -> StepHasher | None:
        if self.on and self._hasher is None:
            kv = self.kv
            self._hasher = StepHasher(kv.pool_tokens, kv.dkv.shape[1], kv.depth)
        return self._hasher if self.on else None

    def log(self, st: ReqState, level: int, phase: str, parents: torch.Tensor) -> None:
        inputs, kv = st.step_inputs or ("-", "-")
        outputs = hash_tensors(st.tokens[:, -1], parents, st.cum)
        log.info(
            "STEP_HASH rid=%s step=%d phase=%s inputs=%s outputs=%s kv=%s cached=%d",
            st.req.rid,
            level,
            phase,
            inputs,
            outputs,
            kv,
            st.cached_tokens,
        )
