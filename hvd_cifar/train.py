"""Data-parallel training of a CNN on CIFAR-style data, gradients synchronised by Horovod
(or another method behind ``hvd_cifar.sync``).

Launch it any of these ways; the code is the same:

    horovodrun -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    horovodrun --gloo -np 2 -H localhost:2 python -m hvd_cifar.train --config configs/demo.yaml
    launch/horovodrun.sh -np 4 -hostfile hostfiles/example-cluster --config configs/cifar10_vgg11.yaml
    mpirun -np 2 -bind-to none -map-by slot python -m hvd_cifar.train --config configs/tiny.yaml
    python -m hvd_cifar.train --config configs/tiny.yaml            # one process

This file only wires things together: config -> sync method -> data -> model and optimizer ->
resume -> the epoch loop (train, evaluate, record, checkpoint) -> final report. One epoch of
training and the evaluation are in hvd_cifar/engine.py, the epoch's figures and its metrics line
in metrics.py, what goes into the run folder's files and the checkpoint in runlog.py, eval.json
in evaluation.py. Every rank computes; rank 0 speaks (progress bar, printed lines, run folder
files; ranks.py hands its errors to every rank). Each epoch appends one line to
logs/RUN_NAME/metrics.jsonl before anything is printed.
"""
from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback

import torch

from hvd_cifar import config as config_mod
from hvd_cifar import (autofreeze, data, engine, evaluation, lifecycle, metrics, netstats, preempt, resources,
                       runlock, runlog)
from hvd_cifar.config import Config, ConfigError
from hvd_cifar.models import build_model, set_frozen_blocks
from hvd_cifar.ranks import USER_ERRORS, before_loop, on_every_rank, on_main, say_once, speak
from hvd_cifar.sync import SyncMethod
from hvd_cifar.sync import make as make_sync
from hvd_cifar.tboard import Board
from hvd_cifar.training import Training

# Exit statuses: 0 done, 1 a fault on some rank, 2 bad input, 3 diverged, 4 preempted (a stop
# signal; the checkpoint holds the place in the epoch, --resume continues), 130 SIGINT.
EXIT_DIVERGED = 3


def load_config(argv: list[str]) -> Config:
    cfg = config_mod.from_args(argv)
    if cfg.resume:  # a resumed run starts from its saved config; flags (e.g. --epochs) still win
        run_dir = runlog.resolve_resume(cfg.resume, cfg.log_dir)
        saved = config_mod.load_yaml(os.path.join(run_dir, "config.yaml"))
        saved.pop("resume", None)
        cfg = config_mod.from_args(argv, base=saved)
        cfg.resume = run_dir
    return cfg


# ----------------------------------------------------------------------------- building the run
def start_backend(cfg: Config) -> tuple[SyncMethod, torch.device]:
    sync = make_sync(cfg.sync, cfg)  # starts the communication backend (hvd.init() for Horovod)
    sync.configure(cfg)
    torch.set_num_threads(cfg.threads_per_rank or max(1, (os.cpu_count() or 1) // sync.local_size))
    if torch.cuda.is_available():
        torch.cuda.set_device(sync.local_rank)  # one GPU per local rank
        return sync, torch.device("cuda", sync.local_rank)
    return sync, torch.device("cpu")


def open_run_dir(cfg: Config, sync: SyncMethod) -> str:
    """Rank 0 creates (or reopens) the run folder, every rank learns where it is. Elastic:
    nothing before the elastic loop may wait on another rank (a worker that joins later runs
    this alone), so the training state carries rank 0's answer to the others instead."""
    def open_and_hold() -> str:
        run_dir = cfg.resume or runlog.create_run_dir(cfg, sync.size)
        runlock.hold(run_dir)  # one job per run folder (held until main ends)
        return run_dir

    return before_loop(sync, open_and_hold, others=lambda: cfg.resume or "")


def build(cfg: Config, sync: SyncMethod, device: torch.device) -> Training:
    """Data (every rank holds the whole set in memory; downloads take turns on a lock), then
    the model: the same seed everywhere, and rank 0's weights broadcast at the start."""
    if cfg.download:
        before_loop(sync, lambda: data.download(cfg.dataset, cfg.data_dir), on_every_rank)
    ds = before_loop(sync, lambda: data.load(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed), on_every_rank)
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
    scaler = torch.amp.GradScaler(device.type) if cfg.amp == "fp16" else None
    return Training(cfg, sync, device, ds, loader, model, runlog.checkpoint_identity(cfg, ds.num_classes),
                    autofreeze.make(cfg, model), scaler=scaler)


def resume(run: Training, run_dir: str) -> None:
    """Rank 0 reads the checkpoint and hands it to every rank (elastic: every rank reads it, and
    the state's first broadcast makes sure they agree); then the model and optimizer load it."""
    cfg, sync = run.cfg, run.sync
    ckpt = None
    if cfg.resume:
        ckpt = before_loop(sync, lambda: runlog.load_checkpoint(run_dir, run.identity))
    run.start_epoch = ckpt["epoch"] if ckpt else 0
    run.resume_at = ckpt.get("position") if ckpt else None
    run.resume_record = ckpt.get("record") if ckpt else None
    run.freezing.load_state_dict(ckpt.get("freezing", {}) if ckpt else {})
    # The trainable set the checkpoint's optimizer was saved with; the epoch loop's
    # follow_freeze_schedule then moves on to the set of start_epoch, as an unbroken run would.
    saved_frozen = ckpt.get("frozen_blocks") if ckpt else None
    run.set_trainable(run.freezing.frozen_blocks(run.start_epoch, 0) if saved_frozen is None else saved_frozen)
    if ckpt:
        runlog.restore_training(ckpt, run.model, run.optimizer, run.scaler, cfg.model)
    if (own := runlog.rank_state(ckpt, sync.rank, sync.size)) is not None:
        sync.load_rank_state(own)  # after set_trainable: the scheme knows its parameters
    if ckpt and cfg.stop_after and cfg.stop_after <= run.start_epoch < cfg.epochs:
        raise ConfigError(f"stop_after: the run already stopped after epoch {run.start_epoch} of {cfg.epochs}, as "
                          f"its stop_after: {cfg.stop_after} asks; to go on: --resume {run_dir} --stop-after 0 "
                          f"(to the end) or --stop-after N (N > {run.start_epoch})")


# ----------------------------------------------------------------------------- the epoch loop
def begin(run: Training, state) -> None:
    """(Re)start: every rank is here with rank 0's state; under elastic training the ranks, and
    with them the shards and the learning rate, may have changed since the last time."""
    cfg, sync = run.cfg, run.sync
    run.run_dir = state.run_dir
    cfg.run_name, cfg.log_dir = os.path.basename(run.run_dir), os.path.dirname(run.run_dir)
    run.log = runlog.RankLog(run.run_dir, sync.rank, echo=run.is_main)
    run.hostnames = tuple(sync.allgather_object(socket.gethostname()))
    first = state.restarts == 0
    if first:
        first_start(run)
    state.begin(run)
    if first:
        runlog.restore_rank_buffers(run.model, run.resume_at, sync.rank, sync.size)
    run.loader.reshard(sync.worker_rank, sync.workers)  # shards for the ranks that train
    run.updates_per_epoch = math.ceil(len(run.loader) / cfg.accumulation_steps)
    run.schedule = engine.LrSchedule(cfg, sync.size, run.updates_per_epoch)


def first_start(run: Training) -> None:
    cfg, sync, run_dir = run.cfg, run.sync, run.run_dir
    # Rank 0: config.yaml, and meta.json or (resumed) the metrics cut back to the checkpoint. A
    # write that fails on rank 0 (full disk) stops every rank with rank 0's one line.
    meta = lambda: runlog.run_metadata(sync.size, list(run.hostnames), sync.name, str(run.device))
    run.elapsed_before = before_loop(sync, lambda: runlog.write_start_files(
        run_dir, cfg, run.start_epoch, run.resume_at, run.resume_record, meta), others=lambda: 0.0)
    run.log(f"run folder {run_dir}: {cfg.model} on {cfg.dataset}, {sync.size} rank(s) "
            f"({', '.join(sorted(set(run.hostnames)))}), sync={cfg.sync}, device={run.device}, "
            f"threads/rank={torch.get_num_threads()}")
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
        follow_freeze_schedule(run, state, epoch)
        run.net.train()
        set_frozen_blocks(run.model, run.frozen)  # train() switched frozen BatchNorm back to batch stats
        nic.start()
        usage.start()
        result = run.sync.epoch_loop(engine.train_one_epoch)(run, state, epoch)
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


def follow_freeze_schedule(run: Training, state, epoch: int) -> None:
    """The freezing policy's set for ``epoch`` (every rank decides alike); a new trainable set
    needs a new optimizer and new sync hooks, and is an events.jsonl line."""
    before = run.frozen
    frozen = run.freezing.frozen_blocks(epoch, before)
    if frozen == before:
        return
    run.set_trainable(frozen, old_optimizer=run.optimizer)
    state.optimizer = run.optimizer
    run.sync.broadcast_state(run.model)
    run.log(f"epoch {epoch}: {frozen} feature block(s) frozen, {run.trainable:,} trainable parameters")
    if run.is_main:
        runlog.append_metrics(run.run_dir, autofreeze.event(epoch, before, frozen, run.trainable,
                                                            run.freezing.why()), runlog.EVENTS)


def evaluate_and_record(run: Training, state, epoch: int, result: engine.EpochResult, measured: metrics.Measured,
                        checkpoint: bool):
    """Sums, phase and resource figures over all ranks, the test set, the checkpoint when
    ``checkpoint``, one metrics line (written, then printed)."""
    sync, cfg = run.sync, run.cfg
    # pass: since this pass over the epoch began
    sums, pass_images, figures = metrics.reduce_epoch(sync, state, result, measured, run.device.type == "cuda")
    eval_start = time.perf_counter()
    sync.consolidate(run.model, run.optimizer)  # one model on every rank (BatchNorm statistics averaged)
    test = engine.evaluate(run)
    record = metrics.epoch_record(run, epoch, result, sums, pass_images, figures, test,
                                  eval_time_s=time.perf_counter() - eval_start)
    engine.Diverged.check_epoch(record["train_loss"], test.loss, run.dataset.num_classes, epoch, result.steps,
                                result.lr)
    rank_states = run.rank_states() if checkpoint else None  # every rank's, before rank 0 saves them
    # Data first, print second; rank 0's write error stops every rank.
    record = on_main(sync, lambda: checkpoint_and_record(run, epoch, record, checkpoint, rank_states))
    run.log(f"epoch {epoch + 1}/{cfg.epochs}  train loss {record['train_loss']:.4f} acc {record['train_acc']:.4f}"
            f"  test loss {test.loss:.4f} acc {test.acc:.4f}  {result.time_s:.1f} s  "
            f"{record['images_per_s']:.0f} img/s  lr {record['lr']:.4g}")
    return record, test.confusion


def checkpoint_and_record(run: Training, epoch: int, record: dict, checkpoint: bool,
                          rank_states: list[dict] | None = None) -> dict:
    """Rank 0: the epoch's checkpoint when one is due, then its metrics line, then TensorBoard's
    copy of the line. The checkpoint goes first so that the line can say what writing it took
    (``checkpoint_time_s``, absent in epochs without one); it carries the line (without that
    figure), so that a job killed between the two gets the line back on resume."""
    if checkpoint:
        began = time.perf_counter()
        runlog.save_training(run.run_dir, epoch, record=record, **run.checkpointed(rank_states))
        record = {**record, "checkpoint_time_s": time.perf_counter() - began}
    run.records = runlog.record_epoch(run.run_dir, record)
    if run.cfg.tensorboard:
        run.board = run.board or Board(run.run_dir, first_epoch=epoch)
        run.board.epoch(record)
    return record


def finish(run: Training, confusion, record: dict | None) -> None:
    """Data-parallel ranks must end with identical parameters; say so (or not) in eval.json,
    with the classification report of the run's last epoch (``confusion``, ``record``)."""
    ranks_agree = len(set(run.sync.allgather_object(evaluation.parameters_digest(run.model)))) == 1
    if not ranks_agree:
        run.log("WARNING: ranks finished with different parameters")
    if confusion is None or not run.is_main:
        return
    test_acc, lines = evaluation.write(run.run_dir, confusion, record, run.dataset.num_classes, run.records,
                                       run.cfg.target_acc, ranks_agree)
    for line in lines:
        run.log(line)
    if run.board:  # this process recorded epochs into TensorBoard: the config, with the final accuracy
        run.board.hparams(run.cfg.to_dict())
    run.log(f"final test accuracy {test_acc:.4f}; run folder {run.run_dir}")


# ----------------------------------------------------------------------------- entry point
def run(cfg: Config) -> tuple[SyncMethod, preempt.Preempted | None]:
    """The whole run on this rank; returns the (closed) sync method, and the stop that ended
    the run early when a signal asked for one (None when it ran to its end)."""
    started = time.perf_counter()
    if not cfg.elastic:  # elastic: a worker that goes away is the driver's to handle
        preempt.install()  # from the start: a stop asked for during set-up is honoured at the first update
    sync, device = start_backend(cfg)
    run_dir = open_run_dir(cfg, sync)
    training = build(cfg, sync, device)
    training.started = started
    resume(training, run_dir)
    at = training.resume_at or {"step": 0, "position": 0, "totals": engine.no_sums()}
    # A checkpoint from before top-5 was counted holds fewer sums: that epoch's top-5 is unknown.
    totals = [*at["totals"], *[math.nan] * (len(engine.SUMS) - len(at["totals"]))]
    state = sync.training_state(training.model, training.optimizer, commit_every=cfg.commit_every,
                                run_dir=run_dir, epoch=training.start_epoch, step=at["step"],
                                position=at["position"], totals=totals)
    stopped = None
    try:
        sync.run_elastic(lambda state: train(training, state))(state)
    except engine.Diverged as exc:  # every rank raised it at the same update, or this one alone
        exc.alone = not sync.diverges_together
        if training.is_main or exc.alone:
            runlog.append_metrics(training.run_dir, exc.event(sync.rank if exc.alone else None), runlog.EVENTS)
        raise
    except preempt.Preempted as exc:  # every rank raised it after the same update
        # No rank may exit before rank 0 has saved and said so: the launcher ends the job at the
        # first exit. on_main's hand-off after both is that wait, so no rank lingers at exit for
        # rank 0's line (a launcher that waits for its ranks, like horovodrun --gloo's, ends sooner).
        buffers = sync.allgather_object(runlog.rank_buffers(training.model))  # each rank's BatchNorm statistics
        rank_states = training.rank_states()
        # Without its traceback, which holds the loop's frames and in them the wrapped model.
        stopped, exc.run_dir = exc.with_traceback(None), training.run_dir

        def save_and_say() -> None:
            runlog.save_preempted(training.run_dir, state, sync.size, buffers, training.elapsed_s(), stopped,
                                  **training.checkpointed(rank_states))
            speak(stopped.line())

        on_main(sync, save_and_say)
    # The wrappers the sync method made hold its communication resources (DDP's reducer holds
    # the process group): let them go before the method closes.
    training.net = training.optimizer = state = None
    sync.close()
    return sync, stopped


def main(argv: list[str] | None = None) -> tuple[int, bool]:
    """Run, and turn whatever ends it into (exit status, whether native threads were left)."""
    argv = sys.argv[1:] if argv is None else argv
    rank = lifecycle.launch_rank()
    try:
        sync, stopped = run(load_config(argv))
        if stopped:  # every rank knows it alike; rank 0's checkpoint is written and its line said
            return preempt.EXIT_PREEMPTED, sync.leaves_threads_running
        return 0, sync.leaves_threads_running
    except USER_ERRORS as exc:
        # Bad input is seen by every rank alike (or handed to all by on_main): one line, from rank 0.
        return say_once(rank, f"hvd_cifar: error: {exc}", 2), False
    except engine.Diverged as exc:
        line = (f"hvd_cifar: diverged: {exc}{f' on rank {rank}' if exc.alone else ''}; the last checkpoint "
                f"(if any) is from before it and untouched. Try a lower lr, lr_scaling: sqrt, a longer "
                f"warmup_epochs or grad_clip (e.g. 1.0)")
        if exc.alone:  # no other rank knows: say it here, and end the job (its ranks wait on this one)
            sys.stderr.write(line + "\n")
            lifecycle.abort_job(EXIT_DIVERGED)
        return say_once(rank, line, EXIT_DIVERGED), False
    except KeyboardInterrupt:
        lifecycle.abort_job(130)
    except Exception as exc:
        if lifecycle.lost_peer(exc):  # another rank failed first and says why; this one only stops
            first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0]
            sys.stderr.write(f"hvd_cifar: rank {rank} stopped: another rank failed or left "
                             f"({type(exc).__name__}: {first[:160]})\n")
        else:  # a fault on this rank alone: say so once, then take the whole job down
            sys.stderr.write(f"hvd_cifar: rank {rank} failed:\n{traceback.format_exc()}")
        lifecycle.abort_job(1)
    finally:
        runlock.release_all()
    return 1, False


if __name__ == "__main__":
    lifecycle.exit_process(*main())
