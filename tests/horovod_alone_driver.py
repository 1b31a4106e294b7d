"""One hvd_cifar.train run with Horovod's entry points counted; run by tests/test_horovod_alone.py
in a subprocess (Horovod and MPI start in it, never in the pytest process).

    python tests/horovod_alone_driver.py local|communicate TRAIN_ARGS...

``communicate`` keeps a one-rank run on Horovod's communicating path (the path before the
no-communication one existed), for comparison. Prints one JSON line: the calls of each counted
Horovod function, the optimizer classes the run trained with, and the run folder.
"""
from __future__ import annotations

import json
import sys

import horovod.torch as hvd

from hvd_cifar import train
from hvd_cifar.sync import horovod as horovod_sync
from hvd_cifar.trainer import context

COUNTED = ("init", "allreduce", "allreduce_async", "allreduce_async_", "grouped_allreduce_async",
           "broadcast_parameters", "broadcast_object", "allgather_object", "synchronize", "DistributedOptimizer")


def main() -> None:
    mode, argv = sys.argv[1], sys.argv[2:]
    calls = dict.fromkeys(COUNTED, 0)

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    for name in COUNTED:
        setattr(hvd, name, counted(name, getattr(hvd, name)))
    if mode == "communicate":  # configure() then finds no other class to become
        horovod_sync.HorovodAlone = horovod_sync.HorovodSync
    optimizers, trainable_set = [], context.Setup.trainable_set

    def recorded(self, *args, **kwargs):
        made = trainable_set(self, *args, **kwargs)
        optimizers.append(f"{type(made.optimizer).__module__}.{type(made.optimizer).__name__}")
        return made

    context.Setup.trainable_set = recorded
    status, _ = train.main(argv)
    print(json.dumps({"status": status, "calls": calls, "optimizers": optimizers}), flush=True)
    train.lifecycle.exit_process(status, True)  # Horovod's threads: no interpreter shutdown


if __name__ == "__main__":
    main()
