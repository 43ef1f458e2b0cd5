"""The HF reference's two beam searches side by side on one long prompt: seconds, peak GPU
memory and whether they rank the same beams (up to near-ties), per search and n.

    python scripts/probes/reference_probe.py --model DIR [--tokens 1000] [--ns 50 256]
        [--dtype float32] [--generate-ns 50 256] [--out probe.jsonl]

``generate`` is HF's ``generate(num_beams=n)`` (every beam its own copy of the prompt);
``shared`` prefills the prompt once (harness.servers.hf_reference.resolve_search). A search
that runs out of memory is reported as such (``error``) and the next case still runs. The
prompt is the engine's chat prompt around a list of numbers, cut to ``--tokens``.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from harness.servers.hf_reference import HFReference


def _case(ref: HFReference, ids: list[int], n: int) -> tuple[dict, list]:
    dev = ref.device == "cuda"
    if dev:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    row: dict = {"search": ref.search, "n": n, "prompt_tokens": len(ids)}
    beams: list = []
    try:
        beams = ref.generate(ids, n)
        if dev:
            torch.cuda.synchronize()
        row["seconds"] = round(time.perf_counter() - t0, 3)
        row["beams"] = len(beams)
    except torch.OutOfMemoryError as exc:
        row["error"] = f"out of memory: {str(exc).splitlines()[0][:160]}"
    if dev:
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row, beams


def _agree(a: list, b: list, tol: float) -> dict:
    """How two rankings differ: beams in one only, above the other's floor by more than tol."""
    if not a or not b:
        return {}
    sa, sb = (
        {tuple(x.token_ids): x.sequence_score for x in a},
        {tuple(x.token_ids): x.sequence_score for x in b},
    )
    floor = min(a[-1].sequence_score, b[-1].sequence_score) + tol
    only = [k for k in sa.keys() ^ sb.keys() if sa.get(k, sb.get(k)) > floor]
    diffs = [abs(x.sequence_score - y.sequence_score) for x, y in zip(a, b)]
    return {
        "same_order": [x.token_ids for x in a] == [y.token_ids for y in b],
        "top1_same": a[0].token_ids == b[0].token_ids,
        "beams_apart_above_ties": len(only),
        "max_rank_score_diff": round(max(diffs), 7),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint directory with catalog.json")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 256])
    ap.add_argument(
        "--generate-ns",
        type=int,
        nargs="*",
        default=None,
        help="n for HF generate too (default: --ns)",
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tol", type=float, default=1e-4, help="near-tie tolerance")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    cat = f"{args.model}/catalog.json"
    shared = HFReference(args.model, cat, device=args.device, dtype=dtype, search="shared")
    hf = HFReference(args.model, cat, device=args.device, dtype=dtype, search="generate")
    hf.model = shared.model  # one copy of the weights: the searches differ, the model does not
    text = "watched " + ", ".join(str(i) for i in range(4 * args.tokens))
    ids = shared.build_prompt(messages=[{"role": "user", "content": text}])[: args.tokens]
    rows = []
    gen_ns = args.ns if args.generate_ns is None else args.generate_ns
    for n in args.ns:
        row, mine = _case(shared, ids, n)
        rows.append(row)
        if n in gen_ns:
            other, theirs = _case(hf, ids, n)
            other.update(_agree(mine, theirs, args.tol))
            rows.append(other)
    with open(args.out, "w") if args.out else open("/dev/null", "w") as fh:
        for row in rows:
            line = json.dumps({"dtype": args.dtype, **row})
            print(line, flush=True)
            fh.write(line + "\n")


if __name__ == "__main__":
    main()
