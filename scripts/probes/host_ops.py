"""Count the torch ops the scheduler issues per step outside the model forward (each is at
least one kernel launch on a GPU, or host work around one). Runs on CPU in seconds:

    python -m flashrec synth --preset tiny --out /tmp/tiny --catalog-size 20000
    PYTHONPATH=. python scripts/probes/host_ops.py --model-path /tmp/tiny [--requests 32 --n 50]

Step 1 prefills every request and decodes level 1; the script counts step 2 (the level-2
decode) and step 3 (``<|sid_end|>`` and the results of every request).
"""

from __future__ import annotations

import argparse
import random

from torch.utils._python_dispatch import TorchDispatchMode

from flashrec.config import EngineConfig
from flashrec.engine.engine import Engine


class OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--sid-vocab-file", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    args = ap.parse_args()
    cfg = EngineConfig(
        model_path=args.model_path,
        sid_vocab_file=args.sid_vocab_file or f"{args.model_path}/catalog.json",
        batch_slots=args.requests * args.n,
        enable_prefix_cache=False,
    )
    eng = Engine(cfg)
    rng = random.Random(0)
    sched = eng.scheduler
    for _ in range(args.requests):
        ids = [rng.randrange(100, 200) for _ in range(args.prompt_tokens)]
        sched.add(eng.new_request(ids, n=args.n))
    sched.step()
    counter, in_model = OpCounter(), [0]
    model, forward = eng.runner.model, eng.runner.model.forward

    def counted_forward(*a, **k):
        before = counter.n
        out = forward(*a, **k)
        in_model[0] += counter.n - before
        return out

    model.forward = counted_forward
    for name in ("level-2 decode step", "end + results step"):
        counter.n, in_model[0] = 0, 0
        with counter:
            done = sched.step()
        print(
            f"{name}: {counter.n - in_model[0]} ops outside the model forward "
            f"({counter.n} in all; {args.requests} requests x n={args.n}; {len(done)} finished)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
