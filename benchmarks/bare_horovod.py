"""The smallest honest Horovod training loop: the yardstick for hvd_cifar's per-step overhead.

    horovodrun -np 2 -H localhost:2 .venv/bin/python benchmarks/bare_horovod.py --model vgg11 --batch-size 32 --steps 10
    .venv/bin/python benchmarks/bare_horovod.py --plain --threads 2 --batch-size 64   # no Horovod at all: one process
    .venv/bin/python benchmarks/bare_horovod.py --plain --compute bf16-channels-last [--compile]

Same model definition and optimizer settings as hvd_cifar.train, but nothing else: pre-made
random batches, no augmentation, no timers, no metrics. Prints one JSON line (rank 0) with the
mean step time of the last epoch, the median step time over the epochs after the first, and
with --compile the seconds the first (compiling) epoch took. --compute names a precision and
layout as hvd_cifar's compute key does (autocast around forward and loss; channels-last
batches); --compile runs the model through torch.compile.
"""
from __future__ import annotations

import argparse
import json
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from testbed import jobs
from hvd_cifar.core.config import COMPUTE_SETTINGS
from hvd_cifar.workload.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs.add_options(parser, model="vgg11", batch_size=32, steps=10, epochs=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--plain", action="store_true",
                        help="a plain PyTorch loop in one process: no hvd.init(), no DistributedOptimizer")
    parser.add_argument("--compute", choices=list(COMPUTE_SETTINGS), default="fp32",
                        help="precision and layout, as hvd_cifar's compute key names them (default fp32)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    amp, channels_last = COMPUTE_SETTINGS[args.compute]

    if not args.plain:
        hvd.init()
    rank, size = (0, 1) if args.plain else (hvd.rank(), hvd.size())
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.model, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    if not args.plain:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(args.batch_size, 3, 32, 32, generator=g),
                torch.randint(0, 10, (args.batch_size,), generator=g)) for _ in range(args.steps)]
    if channels_last:
        batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    model.train()
    net = torch.compile(model) if args.compile else model
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    steps, first_epoch_s = [], 0.0
    for epoch in range(args.epochs):
        start = time.perf_counter()
        for x, y in batches:
            began = time.perf_counter()
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=amp != "none"):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            if epoch:
                steps.append(time.perf_counter() - began)
        step_time = (time.perf_counter() - start) / args.steps
        first_epoch_s = first_epoch_s or time.perf_counter() - start
    if rank == 0:
        median = sorted(steps)[len(steps) // 2] if steps else step_time
        print(json.dumps({"step_time_s": step_time, "median_step_time_s": median, "first_epoch_s": first_epoch_s,
                          "world_size": size}), flush=True)


if __name__ == "__main__":
    main()
