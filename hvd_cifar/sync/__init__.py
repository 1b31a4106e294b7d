"""Gradient synchronisation methods, interchangeable behind one small interface.

The training loop talks only to ``SyncMethod``; each method lives in its own module here and
registers itself in ``METHODS``. Adding a method means adding one file.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Any

import torch

# config value -> module implementing it
METHODS = {
    "horovod": "hvd_cifar.sync.horovod",
    "mpi-allreduce": "hvd_cifar.sync.mpi",
    "mpi-gather-scatter": "hvd_cifar.sync.mpi",
    "ddp": "hvd_cifar.sync.ddp",
}

# Open MPI allreduce algorithm choice by message size; see make().
ALLREDUCE_RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openmpi_allreduce.rules")

_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launch_rank() -> int:
    """This process's rank as the launcher set it, known before any communication starts."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def launched_by_mpi() -> bool:
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ or "PMIX_RANK" in os.environ


# What a collective raises on a rank whose peer died or stopped: the fault is elsewhere, and that
# rank's own message says what it was.
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Horovod has been shut down",
              "Broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` only says that another rank went away (so this rank need not report it)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"HorovodInternalError", "DistNetworkError"}:
        return True
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _PEER_LOST)


def abort_job(code: int = 1) -> None:
    """End every rank of the job now. Under MPI, MPI_Abort takes the others down with this one;
    under horovodrun's Gloo launcher, the driver stops the job when one rank exits non-zero."""
    sys.stdout.flush()
    sys.stderr.flush()
    if launched_by_mpi():
        try:
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(code)
        except Exception:  # noqa: BLE001 - falling through to a hard exit is the point
            pass
    os._exit(code)


# Set by a sync method whose close() leaves native communication threads running; see exit_process.
threads_left_running = False


def exit_process(code: int) -> None:
    """End this process with ``code`` after a run, once every file is written and closed.

    Normally that is ``sys.exit``. But once a DistributedDataParallel wrapper has been built,
    torch keeps the Gloo process group, and its worker threads, alive past
    ``destroy_process_group``. A worker thread still letting go of its last collective's tensors
    when the interpreter starts shutting down is stopped by Python (``pthread_exit``) inside
    torch's non-throwing code, and the process aborts with SIGABRT after a run that succeeded
    (seen about once in 25 runs on 2 busy cores). So when threads were left running, skip the
    interpreter's shutdown: flush, finalize MPI if this process uses it, and exit directly."""
    if not threads_left_running:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    if "mpi4py.MPI" in sys.modules:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()
    os._exit(code)


class SyncMethod:
    """What the training loop needs from a gradient synchronisation method.

    Per optimizer update the loop calls, in order:
      ``accumulate(model, sync_now)`` around each micro-batch's forward and backward,
      ``synchronize(optimizer)`` once the last micro-batch of the update has run backward,
      ``step(optimizer, scaler)`` to apply the averaged gradients.
    """

    name = "base"
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1

    # --- model and optimizer -------------------------------------------------------
    def wrap(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             named_parameters: list[tuple[str, torch.nn.Parameter]], accumulation_steps: int,
             fp16: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Return the (model, optimizer) the loop should use; called again when the set of
        trainable parameters changes, with the *unwrapped* model and a new optimizer."""
        raise NotImplementedError

    def accumulate(self, model: torch.nn.Module, sync_now: bool):
        """Context for one micro-batch; ``sync_now`` is False for all but the last of an update."""
        return contextlib.nullcontext()

    def synchronize(self, optimizer: torch.optim.Optimizer) -> None:
        """Finish averaging gradients across ranks (the part of sync time not hidden in backward)."""
        raise NotImplementedError

    def step(self, optimizer: torch.optim.Optimizer, scaler=None) -> None:
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def broadcast_state(self, model: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers equal to rank 0's."""
        raise NotImplementedError

    # --- small collectives for metrics and coordination ------------------------------
    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def broadcast_object(self, obj: Any) -> Any:
        raise NotImplementedError

    def allgather_object(self, obj: Any) -> list:
        raise NotImplementedError

    # --- training state, and elastic membership ---------------------------------------
    elastic = False

    def training_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **values) -> "TrainingState":
        """What the loop keeps across an elastic reset: the model, the optimizer and ``values``
        (attributes of the result). Without elasticity nothing is ever reset or committed."""
        return TrainingState(model=model, optimizer=optimizer, **values)

    def run_elastic(self, train):
        """``train(state)`` made restartable after workers come or go; here, as it is."""
        return train

    # --- accounting ----------------------------------------------------------------
    def wire_bytes_per_sync(self, payload_bytes: int) -> int:
        """Bytes one rank sends per synchronisation of ``payload_bytes`` of gradients (the busiest
        rank where ranks differ). Ring allreduce: reduce-scatter then allgather, each moving
        (N-1)/N of the payload."""
        n = self.size
        return int(round(2 * (n - 1) / n * payload_bytes)) if n > 1 else 0

    def close(self) -> None:
        pass


class TrainingState:
    """The loop's state as plain attributes; ``commit()`` is where an elastic method saves it
    (and learns of workers coming or going). Here there is nothing to save."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def commit(self) -> None:
        pass


def make(name: str, elastic: bool = False) -> SyncMethod:
    if name not in METHODS:
        raise ValueError(f"unknown sync method {name!r}")
    # Open MPI busy-polls while a rank waits in a call unless it knows the node is
    # oversubscribed. Horovod's background thread sits in such calls between tensors, so with
    # as many ranks as cores the polling takes the cores the training threads need (measured:
    # Horovod's step 1.33x DDP's at np=2 on 2 cores; 0.95x with yielding). Must be set before
    # MPI initialises; a value from the launcher (-mca / -x) still wins.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    # Open MPI's fixed rules pick, for a few ranks and tens of MB, an allreduce that ran at
    # about 0.55 Gbit/s of payload on 1 Gbit/s links (4 hosts, vgg11's 36.9 MB); its ring
    # reaches about 0.85. The rules file (format: coll_tuned's dynamic rules) keeps the fixed
    # decision below 1 MiB, where latency matters (Horovod's per-cycle negotiation, metric
    # sums), and asks for the ring (algorithm 4) from 1 MiB up, for any number of ranks.
    os.environ.setdefault("OMPI_MCA_coll_tuned_use_dynamic_rules", "1")
    os.environ.setdefault("OMPI_MCA_coll_tuned_dynamic_rules_filename", ALLREDUCE_RULES)
    module = importlib.import_module(METHODS[name])
    return module.create(name, elastic) if elastic else module.create(name)
