"""One epoch of data-parallel training, and evaluation: what the entry point (train.py) repeats.

``train_one_epoch`` reads like the step loop of a small training script: batch, forward,
backward, synchronise, step. Everything that is not the algorithm sits around it: the phase
timer, the accumulation arithmetic (``UpdateGroups``), the learning-rate schedule
(``LrSchedule``), the divergence guard and the training state's hooks (which an elastic run
uses to commit; see hvd_cifar/trainer/elastic.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from hvd_cifar.core import stops
from hvd_cifar.core.names import PHASES
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.trainer import preemption, resources, steptrace
from hvd_cifar.workload import data
from hvd_cifar.workload.epoch import EpochResult, batch_sums, no_sums, progress_bar, top_k_correct, zero_sums
from hvd_cifar.workload.optim import set_lr


# ----------------------------------------------------------------------------- bookkeeping
class PhaseTimer:
    """Adds the time since the last lap to a phase. On a GPU it first waits for the queued
    kernels, so that a phase's time is its own and not the next one's."""

    def __init__(self, device: torch.device, window: steptrace.StepWindow | None = None):
        self.cuda = device.type == "cuda"
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.last = self.step_began = time.perf_counter()
        self.step_times: list[float] = []  # each step's wall time, its bookkeeping included
        self.window = window  # comm_timeline: true: the phases of a few steps, each on its own

    def lap(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.totals[phase] += now - self.last
        if self.window is not None:
            self.window.mark(phase, self.last, now)
        self.last = now

    def restart(self) -> None:
        """Start timing afresh (what passes between steps belongs to no phase)."""
        self.last = self.step_began = time.perf_counter()

    def end_step(self) -> None:
        """A step ended: keep its wall time, and start the next step's."""
        self.step_times.append(time.perf_counter() - self.step_began)
        if self.window is not None:
            self.window.end_step()
        self.restart()


class UpdateGroups:
    """Which micro-batches make up one optimizer update. k accumulation steps: steps
    [0, k), [k, 2k), ... each end with a synchronisation; an epoch's tail may hold fewer than k
    steps, and still ends with one (so no gradient is left unapplied at the epoch's end)."""

    def __init__(self, k: int, steps: int):
        self.k, self.steps = k, steps

    def size(self, step: int) -> int:
        """Micro-batches in the update that ``step`` belongs to."""
        return min(self.k, self.steps - (step - step % self.k))

    def ends_update(self, step: int) -> bool:
        return step % self.k == self.size(step) - 1


DIVERGED_LOSS_X = 100.0  # an epoch's mean training loss this many times ln(classes) is divergence


class Diverged(RuntimeError):
    """Training produced non-finite numbers; raised on every rank at the same update (or, for
    the epoch's reduced loss, at the same epoch end), so that all stop together."""

    def __init__(self, what: str, epoch: int, step: int, lr: float, shared: bool = False):
        super().__init__(f"{what} at epoch {epoch + 1}, step {step + 1} (lr {lr:.4g})")
        self.what, self.epoch, self.step, self.lr = what, epoch, step, lr
        self.alone = False  # raised on this rank only (SyncMethod.diverges_together is False)
        self.shared = shared  # from figures every rank holds alike (check_epoch): never alone

    @classmethod
    def check_epoch(cls, train_loss: float, test_loss: float, classes: int, epoch: int, steps: int,
                    lr: float) -> None:
        """At an epoch's end, from losses every rank holds alike (already reduced): a non-finite
        loss (an fp16 grad scaler skips non-finite gradients instead of stopping), or a training
        loss of more than DIVERGED_LOSS_X times chance level, ln(classes), with gradients that
        stayed finite (BatchNorm keeps them so while the weights run away)."""
        for name, value in (("training loss", train_loss), ("test loss", test_loss)):
            if not math.isfinite(value):
                raise cls(f"non-finite {name}", epoch, steps - 1, lr, shared=True)
        if train_loss > DIVERGED_LOSS_X * math.log(classes):
            raise cls(f"training loss {train_loss:.3g} (over {DIVERGED_LOSS_X:g}x chance level)",
                      epoch, steps - 1, lr, shared=True)

    def event(self, rank: int | None = None) -> dict:
        """The events.jsonl line; ``rank``: the rank that saw it, when it saw it alone."""
        return {"event": "diverged", "time": time.time(), "what": self.what, "epoch": self.epoch,
                "step": self.step, "lr": self.lr, **({} if rank is None else {"rank": rank})}


def guard_gradients(optimizer: torch.optim.Optimizer, clip: float, scaler, epoch: int, step: int) -> None:
    """After synchronisation every rank holds the same averaged gradients, so each decides
    alone, with no collective, that training diverged: a non-finite loss on any rank makes the
    average non-finite everywhere. Then clips them to a global norm of ``clip`` (0 = off).
    Under an fp16 grad scaler an overflow is the scaler's to handle (it skips that step)."""
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not params or (scaler is not None and not clip):
        return
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if not torch.isfinite(norm):
        if scaler is not None:
            return
        raise Diverged("non-finite gradients", epoch, step, optimizer.param_groups[0]["lr"])
    if clip:
        torch.nn.utils.clip_grads_with_norm_(params, clip, norm)


@dataclass(eq=False, slots=True)
class TrainingState:
    """Where training stands, and the hooks the loop calls. In a plain run the hooks keep count
    and, after each update, ask whether any rank was told to stop (trainer/preemption.py); a
    method whose ranks share no update boundary to vote at (``stops_by_vote`` False) ends the
    rank at a stop signal instead. Elastic training (trainer/elastic.py) overrides the hooks to
    commit the state, fold running sums and write its events; the loop does not know."""
    sync_method: SyncMethod
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer    # replaced when the trainable set changes (freezing.follow_schedule)
    run_dir: str                        # rank 0's run folder
    epoch: int                          # the epoch under way (0-based)
    step: int                           # steps of it done
    position: int                       # images of it consumed, by all ranks together
    totals: list[float]                 # the epoch's SUMS over all ranks, before this pass
    restarts: int = field(default=0, init=False)  # begins so far
    stop_vote: preemption.StopVote | None = field(init=False)

    def __post_init__(self) -> None:
        self.stop_vote = preemption.StopVote(self.sync_method) if self.sync_method.stops_by_vote else None

    def begin(self, run) -> None:
        """Called at the start of training (elastic: and after every reset), on every rank."""
        self.sync_method.broadcast_state(run.setup.model)  # every rank starts from rank 0's weights
        self.restarts += 1

    def after_step(self, step: int, images: int) -> None:
        """``step`` is done; all ranks together consumed ``images`` in it."""
        self.step, self.position = step + 1, self.position + images

    def after_update(self, sums: torch.Tensor, updates_done: int, more_steps: bool) -> None:
        """An optimizer update is done (``updates_done`` this epoch); ``sums`` are this rank's
        running loss/correct/images since the pass began. When a rank was asked to stop (every
        rank learns it here, after the same update), the epoch's sums so far go into ``totals``
        and Preempted ends the pass. Not after an epoch's last update: its evaluation and
        checkpoint follow, and the next chance to stop is in the next epoch."""
        if self.stop_vote is None:
            stops.end_if_asked()
            return
        if more_steps and (asked := self.stop_vote.ranks_asked()):
            self.totals = (torch.tensor(self.totals, dtype=torch.float64)
                           + self.sync_method.allreduce_sum(sums.cpu())).tolist()
            raise preemption.Preempted(self.epoch, self.step, self.position, asked, self.sync_method.size)

    def epoch_sums(self, reduced: torch.Tensor) -> torch.Tensor:
        """The epoch's loss/correct/images over all ranks: this pass's reduced sums, and those
        before it (a pass continued after a preemption)."""
        return reduced + torch.tensor(self.totals, dtype=torch.float64)

    def end_epoch(self, last: bool) -> None:
        self.epoch, self.step, self.position, self.totals = self.epoch + 1, 0, 0, no_sums()
        if self.stop_vote:
            self.stop_vote.settle()

    def commit(self) -> None:
        """Nothing to save between updates without elasticity."""


# ----------------------------------------------------------------------------- one epoch
def train_one_epoch(run, state, epoch: int) -> EpochResult:
    """Train the model for (the rest of) ``epoch``; ``run`` is the context.Training (its
    ``setup``: what the entry point built once), ``state`` the training state whose hooks see
    each step."""
    setup, net, optimizer = run.setup, run.trainable.net, run.trainable.optimizer
    sync, cfg, loader = setup.sync, setup.cfg, setup.loader
    first, start = state.step, state.position     # 0, 0 unless an interrupted epoch continues
    steps = first + loader.steps_left(start, first)
    groups = UpdateGroups(cfg.accumulation_steps, steps)
    sums = zero_sums(setup.device)
    window = steptrace.StepWindow(first, steps) if cfg.comm_timeline else None
    timer, syncs = PhaseTimer(setup.device, window), first // cfg.accumulation_steps  # a pass begins at an update boundary
    bar = progress_bar(steps, first, f"epoch {epoch + 1}/{cfg.epochs}", run.is_main and cfg.progress)
    batches = loader.epoch(epoch, start, first)
    began, cpu_began = time.perf_counter(), resources.process_cpu_s()
    timer.restart()
    for step in range(first, steps):
        x, y = next(batches)
        timer.lap("data")
        ends_update = groups.ends_update(step)
        with sync.accumulate(net, sync_now=ends_update):
            with setup.autocast():
                out = net(x)
                loss = F.cross_entropy(out, y, label_smoothing=cfg.label_smoothing)
            timer.lap("forward")
            # Mean over the update's micro-batches: k accumulated steps equal one k-times batch.
            setup.backward(loss / groups.size(step))
            timer.lap("backward")
        if ends_update:
            update = epoch * run.updates_per_epoch + step // cfg.accumulation_steps
            set_lr(optimizer, run.schedule(update))
            sync.synchronize(optimizer)
            timer.lap("sync")
            setup.freezing.observe(setup.scaler)  # freeze: auto's measure, on the averaged gradients before clipping
            guard_gradients(optimizer, cfg.grad_clip, setup.scaler, epoch, step)
            sync.step(optimizer, setup.scaler)
            optimizer.zero_grad()
            syncs += 1
            timer.lap("optimizer")
        with torch.no_grad():
            sums += batch_sums(loss, out, y)
        state.after_step(step, loader.step_images(step - first, start))
        if ends_update:
            state.after_update(sums, step // cfg.accumulation_steps + 1, more_steps=step + 1 < steps)
        bar.update(1)
        timer.end_step()
    bar.close()
    return EpochResult(sums, timer.totals, steps, first, syncs, time.perf_counter() - began,
                       optimizer.param_groups[0]["lr"], cpu_s=resources.process_cpu_s() - cpu_began,
                       step_times=timer.step_times, window=window)


# ----------------------------------------------------------------------------- evaluation
@dataclass
class Evaluation:
    """The test set's figures after an epoch, the same on every rank."""
    loss: float
    acc: float                         # top-1
    acc5: float                        # top-5 (TOP_K)
    confusion: torch.Tensor            # [true class, predicted class] counts


def evaluate(run) -> Evaluation:
    """Loss, accuracy (top-1 and top-5) and confusion matrix over the whole test set, sharded
    across ranks; one allreduce."""
    setup, net = run.setup, run.trainable.net
    ds, sync = setup.dataset, setup.sync
    net.eval()
    k = ds.num_classes
    confusion = torch.zeros(k, k, dtype=torch.float64)
    loss_sum, correct5 = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for x, y in data.eval_batches(ds.test_images, ds.test_labels, setup.cfg.eval_batch_size,
                                      sync.rank, sync.size, setup.loader.normalize):
            with setup.autocast():
                out = net(x)
            loss_sum += F.cross_entropy(out.float(), y, reduction="sum").double().cpu()
            correct5 += top_k_correct(out, y).double().cpu()
            pairs = (y * k + out.argmax(1)).cpu()
            confusion += torch.bincount(pairs, minlength=k * k).view(k, k).double()
    totals = sync.allreduce_sum(torch.cat([confusion.flatten(), loss_sum.view(1), correct5.view(1)]))
    confusion = totals[:-2].view(k, k)
    n = confusion.sum().item()
    return Evaluation(totals[-2].item() / n, confusion.diag().sum().item() / n, totals[-1].item() / n,
                      confusion.long())
