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
hvd_cifar/trainer/: what is built once and what changes per epoch in context.py, one epoch of
training and the evaluation in loop.py, the epoch's figures and its metrics line in metrics.py,
the start files, the checkpoint and the records in recording.py, the start or resume in
restore.py, the stop on a signal in preemption.py, the exit statuses in exits.py.
Every rank computes; rank 0 speaks (progress bar, printed lines, run folder files; ranks.py
hands its errors to every rank). Each epoch appends one line to logs/RUN_NAME/metrics.jsonl
before anything is printed.
"""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import time
from typing import Callable

import torch

from hvd_cifar.core import config as config_mod
from hvd_cifar.core import combinations, config_help, launcher, lifecycle, stops
from hvd_cifar.core.config import Config
from hvd_cifar.runfolder import checkpoint, lock, writer
from hvd_cifar.sync import make as make_sync
from hvd_cifar.sync.base import SyncMethod
from hvd_cifar.trainer import compute, exits, freezing, liveness, loop, metrics, netstats, preemption, recording
from hvd_cifar.trainer import resources
from hvd_cifar.trainer.context import Setup, Training, make_state
from hvd_cifar.trainer.ranks import before_loop, on_every_rank
from hvd_cifar.trainer.restore import start_training
from hvd_cifar.workload import data
from hvd_cifar.workload.models import build_model, set_frozen_blocks


def load_config(argv: list[str]) -> Config:
    """The validated config; a resumed run starts from its saved one, what it settled included
    (flags, e.g. --epochs, still win). Rank 0 says once each older spelling the user gave."""
    cfg = config_mod.from_args(argv)
    if cfg.resume:
        run_dir = writer.resolve_resume(cfg.resume, cfg.log_dir)
        saved = writer.saved_config(run_dir)
        saved.pop("resume", None)
        saved.setdefault("compute", "fixed")  # a run saved before compute existed ran its amp and layout as given
        cfg = config_mod.from_args(argv, base=saved).settle("the run folder resumed", resume=run_dir)
    for line in config_mod.aliases_read(argv) if launcher.launch_rank() == 0 else ():
        print(f"hvd_cifar: warning: {line}", file=sys.stderr, flush=True)
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


def build(cfg: Config, sync: SyncMethod, device: torch.device, inert_keys: dict[str, str], started: float) -> Setup:
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
    freeze_settings = freezing.FreezeSettings.of(cfg)
    freezing.check_depth(freeze_settings, model, cfg.model)
    # Precision and layout (compute: auto times them on rank 0 with this model and a real batch).
    batch = loader.normalize(ds.train_images[:cfg.batch_size]), ds.train_labels[:cfg.batch_size]
    choice = before_loop(sync, lambda: compute.decide(cfg, device, model, *batch, elastic=sync.elastic))
    cfg = compute.apply(cfg, choice)  # the copy the run uses: compute's choice settled
    compute.check_device(cfg, device, choice)
    loader.channels_last = cfg.channels_last
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    return Setup(cfg, sync, device, ds, loader, model, checkpoint.checkpoint_identity(cfg, ds.num_classes),
                 freezing.make(freeze_settings, model), scaler, compute_choice=choice, inert_keys=inert_keys,
                 started=started)


# ----------------------------------------------------------------------------- the epoch loop
def begin(run: Training, state) -> None:
    """(Re)start: every rank is here with rank 0's state; under elastic training the ranks, and
    with them the shards and the learning rate, may have changed since the last time."""
    sync = run.setup.sync
    run.run_dir = state.run_dir
    run.log = writer.RankLog(run.run_dir, sync.rank, echo=run.is_main)
    run.hostnames = tuple(sync.allgather_object(socket.gethostname()))
    first = state.restarts == 0
    if first:
        recording.record_start(run)
    state.begin(run)
    if first:
        checkpoint.restore_rank_buffers(run.setup.model, run.start.mid_epoch, sync.rank, sync.size)
    run.follow_ranks()  # shards for the ranks that train


def train(run: Training, state) -> None:
    """The epoch loop: train, evaluate, record, checkpoint; then the final report."""
    begin(run, state)
    setup = run.setup
    cfg = setup.cfg
    end_epoch = min(cfg.epochs, cfg.stop_after) if cfg.stop_after else cfg.epochs
    # Every rank measures its own process, and one rank per host that host's interface counters
    # and CPUs, around each epoch's training.
    host_rank = setup.sync.local_rank == 0
    nic = netstats.NicMeter(netstats.pick_interface(cfg.nic) if host_rank else None)
    usage = resources.ResourceMeter(setup.device, host=host_rank)
    confusion = record = None
    while state.epoch < end_epoch:
        epoch = state.epoch
        freezing.follow_schedule(run, state, epoch)
        run.trainable.net.train()
        # train() switched the frozen blocks' BatchNorm back to batch statistics
        set_frozen_blocks(setup.model, run.trainable.frozen_blocks)
        nic.start()
        usage.start()
        result = setup.sync.run_epoch(run.epoch_context(epoch), lambda: loop.train_one_epoch(run, state, epoch))
        measured = metrics.Measured(nic.interface, nic.stop(), *usage.stop())
        setup.freezing.end_epoch()  # the epoch's gradient measure, before it is recorded and saved
        last = epoch == end_epoch - 1
        save_checkpoint = bool(cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0) or last
        record, confusion = recording.evaluate_and_record(run, state, epoch, result, measured, save_checkpoint)
        state.end_epoch(last)
    recording.finish(run, confusion if end_epoch == cfg.epochs else None, record)
    if run.board:
        run.board.close()
    run.log.close()


# ----------------------------------------------------------------------------- entry point
def run(cfg: Config, inert_keys: dict[str, str] | None = None,
        on_sync: Callable[[SyncMethod], None] = lambda sync: None) -> tuple[SyncMethod, preemption.Preempted | None]:
    """The whole run on this rank; returns the (closed) sync method, and the stop that ended
    the run early when a signal asked for one (None when it ran to its end). ``inert_keys``:
    the keys the user gave that do nothing with the other keys' values, and why (rank 0 warns).
    ``on_sync``: told the sync method as soon as it exists (exits.run_to_status)."""
    started = time.perf_counter()
    if not cfg.elastic:  # elastic: a worker that goes away is the driver's to handle
        stops.install()  # from the start: a stop asked for during set-up is honoured at the first update
    sync, device = start_backend(cfg)
    on_sync(sync)
    run_dir = open_run_dir(cfg, sync)
    # A host that drops off the network is named and the job ended (trainer/liveness.py).
    heartbeat = liveness.start(cfg.liveness_timeout_s, sync, run_dir)
    training = start_training(build(cfg, sync, device, inert_keys or {}, started), run_dir)
    state = make_state(training, run_dir)
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
    training.trainable = state = None
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
