"""Results of finished requests: their beams ranked on the device, ONE asynchronous
device-to-host copy per step, and the results built from the host copy (at once, or one step
later under ``--overlap-results``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from flashrec.beam.search import sequence_scores
from flashrec.engine.request import BeamColumns, GenRequest, GenResult, SidText
from flashrec.engine.scheduler.state import ReqState, by_shape

_REASONS = {True: "stop", False: "length"}  # a beam that ended on <|sid_end|>, or not


@dataclass
class PendingResults:
    """Finished requests whose ranked results are on their way to the host: ``host`` (pinned
    on CUDA) is complete once ``event`` (None on CPU: already complete) has passed."""

    states: list[ReqState]
    ordered: list[int]
    host: torch.Tensor
    event: torch.cuda.Event | None


class ResultManager:
    """``start(states)`` ranks and starts the copy; ``finish(pending)`` waits for it and
    builds the results (beam columns, no object per beam; text built on read)."""

    def __init__(self, length_penalty: float, sid_end: int, text: SidText) -> None:
        self.length_penalty = length_penalty
        self.sid_end = sid_end
        self.text = text

    def start(self, states: list[ReqState]) -> PendingResults:
        """The ranking of finished requests' beams, on the device, and ONE asynchronous
        device-to-host copy of every request's tokens, cumulative logprobs and scores (one sync
        per step, whatever the number of finished requests), into pinned memory with an event
        behind it; :meth:`finish` waits for that event."""
        blocks, ordered = [], []
        for same in by_shape(range(len(states)), lambda i: states[i].tokens.shape):
            ordered.extend(same)  # indices into states, batched per token-history shape
            g = states[same[0]].generated
            cum = torch.stack([states[i].cum for i in same])  # [b, n]
            tokens = torch.stack([states[i].tokens for i in same])  # [b, n, g]
            scores = sequence_scores(cum, g, self.length_penalty)
            alive = torch.isfinite(cum)
            order = torch.sort(
                scores.masked_fill(~alive, float("-inf")), dim=1, descending=True, stable=True
            ).indices
            cols = [tokens.gather(1, order[:, :, None].expand(-1, -1, g)).double()]
            cols += [x.gather(1, order)[:, :, None].double() for x in (cum, scores, alive)]
            blocks.append(torch.cat(cols, dim=2).reshape(-1))  # int64 ids < 2^53: exact
        flat = torch.cat(blocks)
        if flat.device.type != "cuda":
            return PendingResults(states, ordered, flat, None)
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingResults(states, ordered, host, event)

    def finish(self, pending: PendingResults) -> list[tuple[GenRequest, GenResult]]:
        """Wait for a started copy and build the requests' results (ranked beams)."""
        if pending.event is not None and not pending.event.query():  # query: no sync
            pending.event.synchronize()
        states, ordered = pending.states, pending.ordered
        host = pending.host.numpy()
        done_at = time.monotonic()
        out: list[GenResult] = [None] * len(states)  # type: ignore[list-item]
        off = 0
        for i in ordered:
            st = states[i]
            n, g = st.tokens.shape
            blk = host[off : off + n * (g + 3)].reshape(n, g + 3)
            off += n * (g + 3)
            blk = blk[blk[:, g + 2] > 0]  # alive beams, already ranked
            stop = blk[:, g - 1] == self.sid_end if g else np.zeros(len(blk), bool)
            beams = BeamColumns(  # columns, no object per beam; text built on read
                blk[:, :g].astype(np.int64).tolist(),
                blk[:, g].tolist(),
                blk[:, g + 1].tolist(),
                [_REASONS[s] for s in stop.tolist()],
                self.text,
            )
            out[i] = GenResult(
                st.req.rid,
                beams,
                st.req.prompt_len,
                st.cached_tokens,
                queue_s=st.admitted_at - st.req.arrival,
                engine_s=done_at - st.admitted_at,
                done_at=done_at,
                catalog_hash=st.catalog.hash if st.catalog is not None else None,
            )
        return [(st.req, res) for st, res in zip(states, out)]
