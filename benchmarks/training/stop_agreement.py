"""Host time per training step that the stop agreement costs (docs/slurm.md).

``--ranks`` gloo processes on 127.0.0.1 each run ``--steps`` simulated steps (a host wait of
``--step-ms``) and time :meth:`engine.distributed.processes.StopAgreement.after_step` (the all-reduce
read one step late) and, for comparison, the blocking ``settle``. Prints one JSON line:
``ranks``, ``step_ms``, ``steps``, ``after_step_us``, ``blocking_us`` (mean µs per step, rank 0).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from engine.distributed.processes import StopAgreement, free_port


def _timed(call, steps: int, step_s: float) -> float:
    """Mean seconds ``call()`` takes after a host wait of ``step_s``, over ``steps`` steps."""
    total = 0.0
    for _ in range(steps):
        time.sleep(step_s)
        start = time.perf_counter()
        call()
        total += time.perf_counter() - start
    return total / steps


def _rank(rank: int, ranks: int, port: int, steps: int, step_ms: float, results) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=ranks)
    agreement = StopAgreement(ranks)
    _timed(agreement.after_step, 20, step_ms / 1000)  # warm-up
    piped = _timed(agreement.after_step, steps, step_ms / 1000)
    agreement.close()
    blocking = _timed(agreement.settle, steps, step_ms / 1000)
    if rank == 0:
        results.put({"ranks": ranks, "step_ms": step_ms, "steps": steps,
                     "after_step_us": round(piped * 1e6, 1),
                     "blocking_us": round(blocking * 1e6, 1)})
    torch.distributed.destroy_process_group()


def main(argv=None) -> dict:
    """Run the measurement; return (and print) its JSON object."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training.stop_agreement",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="gloo processes on this machine")
    parser.add_argument("--steps", type=int, default=500, help="timed steps")
    parser.add_argument("--step-ms", type=float, default=5.0, help="host wait per step (ms)")
    args = parser.parse_args(argv)
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    torch.multiprocessing.start_processes(
        _rank, args=(args.ranks, free_port(), args.steps, args.step_ms, results),
        nprocs=args.ranks, start_method="spawn")
    result = results.get(timeout=60)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
