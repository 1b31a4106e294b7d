"""What one pass over an epoch yields, as the step loop (hvd_cifar/trainer/loop.py) and a sync
method that runs its own epoch (mpi-async-ps's servers) both report it: the running sums of loss
and correct images, the ``EpochResult``, and the progress display."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from tqdm import tqdm

# An epoch's running sums, per rank, summed over the ranks by the epoch-end allreduce: the loss
# times images, images right at top-1 and at top-5, images. (Top-5 is last so that the others
# keep the places that checkpoints of preempted epochs from before it hold them in.)
SUMS = ("loss", "correct", "images", "correct5")


TOP_K = 5  # top-5 accuracy; with fewer classes than this every prediction is right (1.0)


def no_sums() -> list[float]:
    """The SUMS before any step."""
    return [0.0] * len(SUMS)


def zero_sums(device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.zeros(len(SUMS), dtype=torch.float64, device=device)


def batch_sums(loss: torch.Tensor, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One batch's SUMS: its mean loss times its images, the images right at top-1 and top-5."""
    images = torch.tensor(len(y), dtype=torch.float64, device=y.device)
    return torch.stack([loss.detach().double() * images, (out.argmax(1) == y).sum().double(), images,
                        top_k_correct(out, y).double()])


def top_k_correct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Images whose label is among the TOP_K highest scores. With fewer classes than TOP_K
    every label is among them (top-5 accuracy 1.0)."""
    top = out.topk(min(TOP_K, out.shape[1]), dim=1).indices
    return (top == y[:, None]).any(1).sum()


@dataclass
class EpochResult:
    """One rank's view of one pass over an epoch (elastic: the pass since the last reset)."""
    sums: torch.Tensor                 # float64 SUMS, this rank, this pass
    phase_times: dict[str, float]      # seconds per phase, this rank
    steps: int                         # the epoch's steps in all
    first_step: int                    # where this pass began (0 unless continued)
    syncs: int                         # optimizer updates (synchronisations) of the epoch, before the pass included
    time_s: float                      # wall time of the pass
    lr: float                          # the rate of the last update
    extra: dict = field(default_factory=dict)
    cpu_s: float = 0.0                 # this process's CPU seconds in the pass (resources.process_cpu_s)
    step_times: list = field(default_factory=list)  # this rank's wall time of each step of the pass
    window: Any = None                 # comm_timeline: true: the phases of a few steps (trainer.steptrace.StepWindow)


@dataclass(frozen=True)
class EpochContext:
    """What a sync method's or a scheme's epoch is told of the run (``run_epoch``), and nothing
    else of the trainer."""
    epoch: int                         # 0-based
    epochs: int                        # in the whole run
    run_dir: str
    steps: int                         # a worker's steps (batches) in the epoch
    updates_per_epoch: int             # a worker's optimizer updates in the epoch
    optimizer: torch.optim.Optimizer   # the plain optimizer (its state: momentum)
    device: torch.device
    progress: bool                     # this rank shows a progress bar
    # The learning rate per update for ``ranks`` ranks of ``updates`` updates an epoch:
    # lr_schedule(ranks, updates)(update) (workload.optim.LrSchedule).
    lr_schedule: Callable[[int, int], Callable[[int], float]]


class PlainProgress:
    """Progress for a file or a launcher's pipe: one whole line (one write) every
    ``every_s`` seconds and at the end, instead of tqdm's carriage-return frames."""

    def __init__(self, total: int, initial: int, desc: str, every_s: float = 30.0):
        self.total, self.n, self.desc, self.every_s = total, initial, desc, every_s
        self.started = self.last = time.perf_counter()
        self.first = initial

    def update(self, steps: int) -> None:
        self.n += steps
        if time.perf_counter() - self.last >= self.every_s:
            self._line()

    def close(self) -> None:
        self._line()

    def _line(self) -> None:
        self.last = time.perf_counter()
        rate = (self.n - self.first) / max(self.last - self.started, 1e-9)
        sys.stderr.write(f"{self.desc}: step {self.n}/{self.total} ({rate:.2f} steps/s)\n")
        sys.stderr.flush()


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
    """tqdm's bar on a terminal; into a file or a launcher's pipe, plain lines (PlainProgress)."""
    if enabled and not sys.stderr.isatty():
        return PlainProgress(total, initial, desc)
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)
