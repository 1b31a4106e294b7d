"""How a rank's run ends, as an exit status and at most one line: every way a run can end
(done, bad input, divergence, a stop signal, a fault here or on another rank) is turned into
the status the launcher and Slurm see.

    0    done
    1    a fault on some rank (that rank says what; the others say they stopped for it)
         or a host dropped off the network (rank 0 names it: trainer/liveness.py)
    2    bad input (config, data set, run folder, checkpoint): one line, from rank 0
    3    diverged (the last checkpoint is from before it, untouched)
    4    preempted: a stop signal; the checkpoint holds the place in the epoch, --resume goes on
    130  SIGINT
"""
from __future__ import annotations

import sys
import traceback
from typing import Callable

from hvd_cifar.core import launcher, lifecycle
from hvd_cifar.runfolder import lock
from hvd_cifar.trainer.loop import Diverged
from hvd_cifar.trainer.ranks import USER_ERRORS, say_once

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_PREEMPTED = 4
EXIT_INTERRUPTED = 130


def run_to_status(run: Callable[[Callable], tuple]) -> tuple[int, bool]:
    """Call ``run(started)``, which returns (the closed sync method, the stop that ended the run
    early or None), and turn whatever ends it into (exit status, whether native threads were
    left). ``run`` calls ``started(sync)`` once its sync method exists: a run that bad input or
    divergence ends after that ends as that method's threads require (DDP's Gloo threads, once
    its process group is up, abort an interpreter's ordinary shutdown now and then)."""
    rank = launcher.launch_rank()
    methods: list = []

    def threads_left() -> bool:
        return any(method.leaves_threads_running for method in methods)

    try:
        sync, stopped = run(methods.append)
        if stopped:  # every rank knows it alike; rank 0's checkpoint is written and its line said
            return EXIT_PREEMPTED, sync.leaves_threads_running
        return 0, sync.leaves_threads_running
    except USER_ERRORS as exc:
        # Bad input is seen by every rank alike (or handed to all by on_main): one line, from rank 0.
        return say_once(rank, f"hvd_cifar: error: {exc}", EXIT_BAD_INPUT), threads_left()
    except Diverged as exc:
        line = (f"hvd_cifar: diverged: {exc}{f' on rank {rank}' if exc.alone else ''}; the last checkpoint "
                f"(if any) is from before it and untouched. Try a lower lr, lr_scaling: sqrt, a longer "
                f"warmup_epochs or grad_clip (e.g. 1.0)")
        if exc.alone:  # no other rank knows: say it here, and end the job (its ranks wait on this one)
            sys.stderr.write(line + "\n")
            lifecycle.abort_job(EXIT_DIVERGED)
        return say_once(rank, line, EXIT_DIVERGED), threads_left()
    except KeyboardInterrupt:
        lifecycle.abort_job(EXIT_INTERRUPTED)
    except Exception as exc:
        if lifecycle.lost_peer(exc):  # another rank failed first and says why; this one only stops
            first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
            sys.stderr.write(f"hvd_cifar: rank {rank} stopped: another rank failed or left "
                             f"({type(exc).__name__}: {first[:160]})\n")
        else:  # a fault on this rank alone: say so once, then take the whole job down
            sys.stderr.write(f"hvd_cifar: rank {rank} failed:\n{traceback.format_exc()}")
        lifecycle.abort_job(1)
    finally:
        lock.release_all()
    return 1, False
