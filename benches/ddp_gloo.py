"""PyTorch DDP over gloo, the reference for `trainrun bench --only scale`.

One process per rank, started by the bench inside the same network namespaces as trainrun's
tasks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment), one thread each.

  step       the scale bench's job: 784 -> Dense 32 relu -> Dense 10, SGD 0.05, cross-entropy,
             `--batch` random 28x28 images per rank, `--steps` steps; rank 0 prints
             {"step_ms": [...]}: the wall time between consecutive step ends, as trainrun's
             metrics.jsonl gives it.
  allreduce  dist.all_reduce of 1 KB, 1 MB and 16 MB float32 tensors, each round after a
             barrier, the slowest rank's time per round, rounds as trainrun's collective bench
             (50e6 / floats, clamped to 10..100, after 3 warm-up rounds); rank 0 prints
             {"bytes": [...], "median_s": [...]}.

Prints "skipped: ..." and exits 0 when torch cannot be imported.
"""

import argparse
import datetime
import json
import sys
import time

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:  # the bench reports the skip
    print(f"skipped: no torch in this Python ({e})")
    sys.exit(0)

SIZES = [256, 262_144, 4_194_304]


def rounds(floats):
    return max(10, min(100, 50_000_000 // max(floats, 1)))


def step(batch, steps):
    torch.manual_seed(5 + dist.get_rank())
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    xs = torch.rand(steps, batch, 28, 28)
    ys = torch.randint(0, 10, (steps, batch))
    ends = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(xs[i]), ys[i])
        loss.backward()
        opt.step()
        loss.item()
        ends.append(time.perf_counter())
    dist.barrier()
    if dist.get_rank() == 0:
        print(json.dumps({"step_ms": [(b - a) * 1e3 for a, b in zip(ends, ends[1:])]}))


def allreduce():
    medians = []
    for floats in SIZES:
        t = torch.ones(floats)
        n = rounds(floats)
        mine = torch.zeros(n, dtype=torch.float64)
        for i in range(3 + n):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            took = time.perf_counter() - start
            if i >= 3:
                mine[i - 3] = took
            t.fill_(1.0)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        medians.append(float(mine.sort().values[n // 2]))
    if dist.get_rank() == 0:
        print(json.dumps({"bytes": [4 * s for s in SIZES], "median_s": medians}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["step", "allreduce"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    try:
        if a.mode == "step":
            step(a.batch, a.steps)
        else:
            allreduce()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
