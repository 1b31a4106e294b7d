"""Data-parallel training of a CNN on CIFAR-style data, gradients synchronised by Horovod
(or another method behind ``hvd_cifar.sync``).

Launch it any of these ways; the code is the same:

    horovodrun -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    horovodrun --gloo -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --config configs/cifar10_vgg11.yaml
    mpirun -np 2 -bind-to none -map-by slot python -m hvd_cifar.train --config configs/tiny.yaml
    python -m hvd_cifar.train --config configs/tiny.yaml            # one process

This file only wires things together: config -> sync method -> data -> model and optimizer ->
resume -> the epoch loop (train, evaluate, record, checkpoint) -> final report. The parts are in
hvd_cifar/trainer/: one epoch of training and the evaluation in loop.py, the epoch's figures
and its metrics line in metrics.py, the checkpoint and the records in recording.py, the
resume in restore.py, the stop on a signal in preemption.py, the exit statuses in exits.py.
Every rank computes; rank 0 speaks (progress bar, printed lines, run folder files; ranks.py
hands its errors to every rank). Each epoch appends one line to logs/RUN_NAME/metrics.jsonl
before anything is printed.
"""
from __future__ import annotations

import faulthandler
import math
import os
import socket
import sys
import time
from typing import Callable

import torch

from hvd_cifar.core import config as config_mod
from hvd_cifar.core import combinations, config_help, launcher, lifecycle, stops
from hvd_cifar.core.config import Config, ConfigError
from hvd_cifar.runfolder import checkpoint, lock, writer
from hvd_cifar.sync import make as make_sync
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.trainer import compute, exits, freezing, liveness, loop, metrics, netstats, preemption, resources
from hvd_cifar.trainer.context import Training, make_state
from hvd_cifar.trainer.ranks import before_loop, on_every_rank, on_main
from hvd_cifar.trainer.recording import checkpoint_and_record, finish
from hvd_cifar.trainer.restore import resume
from hvd_cifar.workload import data
from hvd_cifar.workload.epoch import SUMS, EpochContext, EpochResult, no_sums
from hvd_cifar.workload.models import build_model, set_frozen_blocks
from hvd_cifar.workload.optim import LrSchedule, OptimSettings


def load_config(argv: list[str]) -> Config:
    cfg = config_mod.from_args(argv)
    if cfg.resume:  # a resumed run starts from its saved config; flags (e.g. --epochs) still win
        run_dir = writer.resolve_resume(cfg.resume, cfg.log_dir)
        saved = config_mod.load_yaml(os.path.join(run_dir, "config.yaml"))
        saved.pop("resume", None)
        saved.setdefault("compute", "fixed")  # a run saved before compute existed ran its amp and layout as given
        cfg = config_mod.from_args(argv, base=saved)
        cfg.resume = run_dir
    return cfg


# ----------------------------------------------------------------------------- building the run
def start_backend(cfg: Config) -> tuple[SyncMethod, torch.device]:
    sync = make_sync(cfg.sync, cfg)  # starts the communication backend (hvd.init() for Horovod), configured
    torch.set_num_threads(compute.threads_for_rank(cfg, sync))
    if torch.cuda.is_available():
        # One GPU per local rank; more local ranks than GPUs share them round robin (a one-GPU
        # machine runs a multi-rank check with every rank on its one card).
        gpu = sync.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        return sync, torch.device("cuda", gpu)
    return sync, torch.device("cpu")


def open_run_dir(cfg: Config, sync: SyncMethod) -> str:
    """Rank 0 creates (or reopens) the run folder, every rank learns where it is. Elastic:
    nothing before the elastic loop may wait on another rank (a worker that joins later runs
    this alone), so the training state carries rank 0's answer to the others instead."""
    def open_and_hold() -> str:
        run_dir = cfg.resume or writer.create_run_dir(cfg, sync.size)
        lock.hold(run_dir)  # one job per run folder (held until main ends)
        return run_dir

    return before_loop(sync, open_and_hold, others=lambda: cfg.resume or "")


def build(cfg: Config, sync: SyncMethod, device: torch.device) -> Training:
    """Data (every rank holds the whole set in memory; downloads take turns on a lock), then
    the model: the same seed everywhere, and rank 0's weights broadcast at the start."""
    if cfg.download:
        before_loop(sync, lambda: data.download(cfg.dataset, cfg.data_dir), on_every_rank)
    ds = before_loop(sync, lambda: data.load(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                                             (cfg.shapes_train, cfg.shapes_test, cfg.shapes_seed),
                                             ranks_here=sync.local_size), on_every_rank)
    mean, std = ds.channel_stats()
    ds.to(device)
    loader = data.ShardedLoader(ds.train_images, ds.train_labels, cfg.batch_size, sync.worker_rank,
                                sync.workers, cfg.seed, mean.to(device), std.to(device),
                                augment=cfg.augment, hflip=ds.hflip,
                                max_steps=cfg.max_steps_per_epoch, channels_last=cfg.channels_last)
    torch.manual_seed(cfg.seed)
    # channels_last applies to the input batches only: convolutions then run in NHWC, while the
    # parameters (and, by autograd's layout contract, their gradients) stay contiguous, which
    # is what allreduce and broadcast of flat buffers require.
    model = build_model(cfg.model, ds.num_classes, cfg.batchnorm).to(device)
    depth = len(model.feature_blocks)
    for frozen in (cfg.freeze, *cfg.freeze_schedule.values()):
        if frozen != "auto" and frozen > depth:
            raise ConfigError(f"freeze: {frozen} blocks asked for but {cfg.model} has {depth}")
    # Precision and layout (compute: auto times them on rank 0 with this model and a real batch).
    batch = loader.normalize(ds.train_images[:cfg.batch_size]), ds.train_labels[:cfg.batch_size]
    choice = before_loop(sync, lambda: compute.decide(cfg, device, model, *batch, elastic=sync.elastic))
    compute.apply(cfg, choice)
    compute.check_device(cfg, device, choice)
    loader.channels_last = cfg.channels_last
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    return Training(cfg, sync, device, ds, loader, model, checkpoint.checkpoint_identity(cfg, ds.num_classes),
                    freezing.make(freezing.FreezeSettings.of(cfg), model), scaler=scaler, compute_choice=choice)


# ----------------------------------------------------------------------------- the epoch loop
def begin(run: Training, state) -> None:
    """(Re)start: every rank is here with rank 0's state; under elastic training the ranks, and
    with them the shards and the learning rate, may have changed since the last time."""
    cfg, sync = run.cfg, run.sync
    run.run_dir = state.run_dir
    cfg.run_name, cfg.log_dir = os.path.basename(run.run_dir), os.path.dirname(run.run_dir)
    run.log = writer.RankLog(run.run_dir, sync.rank, echo=run.is_main)
    run.hostnames = tuple(sync.allgather_object(socket.gethostname()))
    first = state.restarts == 0
    if first:
        first_start(run)
    state.begin(run)
    if first:
        checkpoint.restore_rank_buffers(run.model, run.resume_at, sync.rank, sync.size)
    run.loader.reshard(sync.worker_rank, sync.workers)  # shards for the ranks that train
    run.updates_per_epoch = math.ceil(len(run.loader) / cfg.accumulation_steps)
    run.schedule = LrSchedule(OptimSettings.of(cfg), sync.size, run.updates_per_epoch)


def first_start(run: Training) -> None:
    cfg, sync, run_dir = run.cfg, run.sync, run.run_dir
    # Rank 0: config.yaml, and meta.json or (resumed) the metrics cut back to the checkpoint. A
    # write that fails on rank 0 (full disk) stops every rank with rank 0's one line.
    meta = lambda: dict(writer.run_metadata(sync.size, list(run.hostnames), sync.name, str(run.device)),
                        inert_keys=run.inert_keys, compute_choice=run.compute_choice,
                        threads_per_rank=torch.get_num_threads())
    run.elapsed_before = before_loop(sync, lambda: writer.write_start_files(
        run_dir, cfg, run.start_epoch, run.resume_at, run.resume_record, meta), others=lambda: 0.0)
    run.log(f"run folder {run_dir}: {cfg.model} on {cfg.dataset}, {sync.size} rank(s) "
            f"({', '.join(sorted(set(run.hostnames)))}), sync={cfg.sync}, device={run.device}, "
            f"threads/rank={torch.get_num_threads()}, compute={cfg.compute} ({compute.described(run.compute_choice)})")
    for key, why in run.inert_keys.items() if run.is_main else ():
        print(f"hvd_cifar: warning: {key}: has no effect here ({why}); the run goes on without it",
              file=sys.stderr, flush=True)
    if cfg.resume and run.resume_at:
        run.log(f"resuming epoch {run.start_epoch + 1} of {cfg.epochs} after step {run.resume_at['step']}")
    elif cfg.resume:
        run.log(f"resuming after epoch {run.start_epoch} of {cfg.epochs}")


def train(run: Training, state) -> None:
    """The epoch loop: train, evaluate, record, checkpoint; then the final report."""
    cfg = run.cfg
    begin(run, state)
    end_epoch = min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs
    # Every rank measures its own process, and one rank per host that host's interface counters
    # and CPUs, around each epoch's training.
    host_rank = run.sync.local_rank == 0
    nic = netstats.NicMeter(netstats.pick_interface(cfg.nic) if host_rank else None)
    usage = resources.ResourceMeter(run.device, host=host_rank)
    confusion = record = None
    while state.epoch < end_epoch:
        epoch = state.epoch
        freezing.follow_schedule(run, state, epoch)
        run.net.train()
        set_frozen_blocks(run.model, run.frozen)  # train() switched frozen BatchNorm back to batch stats
        nic.start()
        usage.start()
        result = run.sync.run_epoch(epoch_context(run, epoch), lambda: loop.train_one_epoch(run, state, epoch))
        measured = metrics.Measured(nic.interface, nic.stop(), *usage.stop())
        run.freezing.end_epoch()  # the epoch's gradient measure, before it is recorded and saved
        last = epoch == end_epoch - 1
        checkpoint = bool(cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0) or last
        record, confusion = evaluate_and_record(run, state, epoch, result, measured, checkpoint)
        state.end_epoch(last)
    finish(run, confusion if end_epoch == cfg.epochs else None, record)
    if run.board:
        run.board.close()
    run.log.close()


def epoch_context(run: Training, epoch: int) -> EpochContext:
    """What the sync method's epoch is told of the run."""
    cfg, settings = run.cfg, OptimSettings.of(run.cfg)
    return EpochContext(epoch, cfg.epochs, run.run_dir, len(run.loader), run.updates_per_epoch, run.optimizer,
                        run.device, run.is_main and cfg.progress,
                        lambda ranks, updates: LrSchedule(settings, ranks, updates))


def evaluate_and_record(run: Training, state, epoch: int, result: EpochResult, measured: metrics.Measured,
                        checkpoint: bool):
    """Sums, phase and resource figures over all ranks, the test set, the checkpoint when
    ``checkpoint``, one metrics line (written, then printed)."""
    sync, cfg = run.sync, run.cfg
    # pass: since this pass over the epoch began
    sums, pass_images, figures = metrics.reduce_epoch(sync, state, result, measured, run.device.type == "cuda")
    eval_start = time.perf_counter()
    sync.consolidate(run.model, run.optimizer)  # one model on every rank (BatchNorm statistics averaged)
    test = loop.evaluate(run)
    record = metrics.epoch_record(run, epoch, result, sums, pass_images, figures, test,
                                  eval_time_s=time.perf_counter() - eval_start)
    loop.Diverged.check_epoch(record["train_loss"], test.loss, run.dataset.num_classes, epoch, result.steps,
                                result.lr)
    rank_states = run.rank_states() if checkpoint else None  # every rank's, before rank 0 saves them
    # Data first, print second; rank 0's write error stops every rank.
    record = on_main(sync, lambda: checkpoint_and_record(run, epoch, record, checkpoint, rank_states))
    run.log(f"epoch {epoch + 1}/{cfg.epochs}  train loss {record['train_loss']:.4f} acc {record['train_acc']:.4f}"
            f"  test loss {test.loss:.4f} acc {test.acc:.4f}  {result.time_s:.1f} s  "
            f"{record['images_per_s']:.0f} img/s  lr {record['lr']:.4g}")
    return record, test.confusion


# ----------------------------------------------------------------------------- entry point
def run(cfg: Config, inert_keys: dict[str, str] | None = None,
        on_sync: Callable[[SyncMethod], None] = lambda sync: None) -> tuple[SyncMethod, preemption.Preempted | None]:
    """The whole run on this rank; returns the (closed) sync method, and the stop that ended
    the run early when a signal asked for one (None when it ran to its end). ``inert_keys``:
    the keys the user gave that do nothing under the other settings, and why (rank 0 warns).
    ``on_sync``: told the sync method as soon as it exists (exits.run_to_status)."""
    started = time.perf_counter()
    if not cfg.elastic:  # elastic: a worker that goes away is the driver's to handle
        stops.install()  # from the start: a stop asked for during set-up is honoured at the first update
    sync, device = start_backend(cfg)
    on_sync(sync)
    run_dir = open_run_dir(cfg, sync)
    # A host that drops off the network is named and the job ended (trainer/liveness.py).
    heartbeat = liveness.start(cfg.liveness_timeout_s, sync, run_dir)
    training = build(cfg, sync, device)
    training.started = started
    training.inert_keys = inert_keys or {}
    resume(training, run_dir)
    at = training.resume_at or {"step": 0, "position": 0, "totals": no_sums()}
    # A checkpoint from before top-5 was counted holds fewer sums: that epoch's top-5 is unknown.
    totals = [*at["totals"], *[math.nan] * (len(SUMS) - len(at["totals"]))]
    state = make_state(sync, training.model, training.optimizer, commit_every=cfg.commit_every,
                       run_dir=run_dir, epoch=training.start_epoch, step=at["step"],
                       position=at["position"], totals=totals)
    stopped = None
    try:
        sync.run_elastic(lambda state: train(training, state))(state)
    except loop.Diverged as exc:  # every rank raised it at the same update, or this one alone
        exc.alone = not (exc.shared or sync.diverges_together)
        if training.is_main or exc.alone:
            writer.append_metrics(training.run_dir, exc.event(sync.rank if exc.alone else None), writer.EVENTS)
        raise
    except preemption.Preempted as exc:  # every rank raised it after the same update
        stopped = preemption.save_and_stop(training, state, exc)
    # The wrappers the sync method made hold its communication resources (DDP's reducer holds
    # the process group): let them go before the method closes.
    training.net = training.optimizer = state = None
    liveness.stop(heartbeat)
    sync.close()
    return sync, stopped


def main(argv: list[str] | None = None) -> tuple[int, bool]:
    """Run, and turn whatever ends it into (exit status, whether native threads were left)."""
    argv = sys.argv[1:] if argv is None else argv
    if config_help.asks_for_help(argv):  # every key, from the config itself; rank 0 says it once
        if launcher.launch_rank() == 0:
            sys.stdout.write(config_help.help_text())
        return 0, False

    def configured_run(on_sync):
        cfg = load_config(argv)
        netstats.check_interface(cfg.nic)  # this host's, before anything starts
        return run(cfg, combinations.inert_keys(cfg, config_mod.given_keys(argv)), on_sync)

    return exits.run_to_status(configured_run)


def cli() -> None:
    """The ``hvd-cifar-train`` command (pyproject.toml): ``main``, then the process's end."""
    # A native crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) prints each Python thread's stack
    # before the process dies of it, which names the call that crashed (Open MPI's own report,
    # which it installs only over the default handler, shows one C frame that names nothing).
    faulthandler.enable(all_threads=True)
    lifecycle.exit_process(*main())


if __name__ == "__main__":
    cli()
