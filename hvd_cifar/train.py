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
training and the evaluation are in hvd_cifar/engine.py. Every rank computes; rank 0 speaks
(progress bar, printed lines, run folder files). Each epoch appends one line to
logs/RUN_NAME/metrics.jsonl before anything is printed.
"""
from __future__ import annotations

import hashlib
import math
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from hvd_cifar import config as config_mod
from hvd_cifar import autofreeze, data, engine, lifecycle, netstats, preempt, resources, runlog, runs, tboard
from hvd_cifar.config import Config, ConfigError
from hvd_cifar.data import DataError
from hvd_cifar.models import build_model, set_frozen_blocks
from hvd_cifar.runlog import RunError
from hvd_cifar.sync import SyncMethod
from hvd_cifar.sync import make as make_sync

USER_ERRORS = (ConfigError, DataError, RunError)
SILENT_RANK_EXIT_DELAY_S = 5.0
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


# ----------------------------------------------------------------------------- rank 0 and the rest
def _user_error(name_and_message: tuple[str, str]) -> Exception:
    """A user error rebuilt on this rank from (class name, message) sent by another."""
    name, message = name_and_message
    return {cls.__name__: cls for cls in USER_ERRORS}[name](message)


def on_main(sync: SyncMethod, fn):
    """Run ``fn`` on rank 0 only and hand its result, or its user error, to every rank, so that
    a failure seen by rank 0 alone still stops all ranks together instead of leaving them hung."""
    result, error = None, None
    if sync.rank == 0:
        try:
            result = fn()
        except USER_ERRORS as exc:
            error = (type(exc).__name__, str(exc))
    result, error = sync.broadcast_object((result, error))
    if error:
        raise _user_error(error)
    return result


def on_every_rank(sync: SyncMethod, fn):
    """Run ``fn`` on every rank; a user error on any rank (a data set missing on one host only)
    is raised on all of them, so they stop together with one message instead of hanging."""
    if sync.elastic:
        # Before the elastic loop each worker answers for itself (one that joins later runs this
        # alone); a worker that fails here drops out, and Horovod's driver carries on without it.
        return fn()
    result, error = None, None
    try:
        result = fn()
    except USER_ERRORS as exc:
        error = (type(exc).__name__, str(exc))
    errors = [e for e in sync.allgather_object(error) if e]
    if errors:
        raise _user_error(errors[0])
    return result


# ----------------------------------------------------------------------------- what a run is made of
@dataclass
class Training:
    """Everything the epoch loop and engine.train_one_epoch use, built once by ``build``."""
    cfg: Config
    sync: SyncMethod
    device: torch.device
    dataset: data.DataSet
    loader: data.ShardedLoader
    model: torch.nn.Module              # the plain model (checkpoints, freezing)
    identity: dict                      # what a checkpoint must match to be resumed here
    freezing: autofreeze.ConfigFreezing | autofreeze.AutoFreeze  # decides ``frozen`` per epoch
    start_epoch: int = 0
    resume_at: dict | None = None       # a preempted run's place inside start_epoch (checkpoint's "position")
    resume_record: dict | None = None   # the metrics line of the checkpoint's epoch, as the checkpoint holds it
    net: torch.nn.Module = None         # the model as the sync method wrapped it
    optimizer: torch.optim.Optimizer = None
    payload_bytes: int = 0              # gradient bytes per synchronisation
    unfrozen_payload_bytes: int = 0     # ... were nothing frozen: what freezing saves is measured against it
    trainable: int = 0
    frozen: int = 0
    scaler: torch.amp.GradScaler | None = None
    run_dir: str = ""
    log: runlog.RankLog | None = None
    board: tboard.Board | None = None   # rank 0, tensorboard: true: opened at the first epoch recorded
    hostnames: tuple = ()
    schedule: engine.LrSchedule | None = None
    updates_per_epoch: int = 1
    started: float = 0.0                # time.perf_counter() when this process began the run
    elapsed_before: float = 0.0         # wall time of the run before a resume

    def elapsed_s(self) -> float:
        """Wall time since the run started (training, evaluation and set-up; across resumes)."""
        return self.elapsed_before + time.perf_counter() - self.started

    @property
    def is_main(self) -> bool:
        return self.sync.rank == 0

    def autocast(self):
        use = self.cfg.amp != "none"
        dtype = torch.float16 if self.cfg.amp == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype, enabled=use)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def set_trainable(self, frozen: int, old_optimizer=None) -> None:
        """Freeze the first ``frozen`` feature blocks and (re)build the optimizer over the rest,
        wrapped by the sync method; momentum of parameters that stay trainable carries over."""
        self.frozen = frozen
        set_frozen_blocks(self.model, frozen)
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        decay = [p for n, p in named if p.ndim > 1]           # no weight decay on biases / BN
        no_decay = [p for n, p in named if p.ndim <= 1]
        cfg = self.cfg
        opt = torch.optim.SGD([{"params": decay, "weight_decay": cfg.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
        if old_optimizer is not None:
            opt.state.update({p: old_optimizer.state[p] for _, p in named if p in old_optimizer.state})
        self.net, self.optimizer = self.sync.wrap(self.model, opt, named, cfg.accumulation_steps,
                                                  cfg.fp16_allreduce)
        self.payload_bytes = self.sync.payload_bytes(named, cfg.fp16_allreduce)
        self.unfrozen_payload_bytes = self.sync.payload_bytes(list(self.model.named_parameters()), cfg.fp16_allreduce)
        self.trainable = sum(p.numel() for _, p in named)


def start_backend(cfg: Config) -> tuple[SyncMethod, torch.device]:
    sync = make_sync(cfg.sync, cfg.elastic)  # starts the communication backend (hvd.init() for Horovod)
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
    if sync.elastic:
        return cfg.resume or (runlog.create_run_dir(cfg, sync.size) if sync.rank == 0 else "")
    return on_main(sync, lambda: cfg.resume or runlog.create_run_dir(cfg, sync.size))


def build(cfg: Config, sync: SyncMethod, device: torch.device) -> Training:
    """Data (every rank holds the whole set in memory; downloads take turns on a lock), then
    the model: the same seed everywhere, and rank 0's weights broadcast at the start."""
    if cfg.download:
        on_every_rank(sync, lambda: data.download(cfg.dataset, cfg.data_dir))
    ds = on_every_rank(sync, lambda: data.load(cfg.dataset, cfg.data_dir, cfg.synthetic_size, cfg.seed))
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
        load = lambda: runlog.load_checkpoint(run_dir, run.identity)  # noqa: E731
        ckpt = load() if sync.elastic else on_main(sync, load)
    run.start_epoch = ckpt["epoch"] if ckpt else 0
    run.resume_at = ckpt.get("position") if ckpt else None
    run.resume_record = ckpt.get("record") if ckpt else None
    run.freezing.load_state_dict(ckpt.get("freezing", {}) if ckpt else {})
    # The trainable set the checkpoint's optimizer was saved with; the epoch loop's
    # follow_freeze_schedule then moves on to the set of start_epoch, as an unbroken run would.
    saved_frozen = ckpt.get("frozen_blocks") if ckpt else None
    run.set_trainable(run.freezing.frozen_blocks(run.start_epoch, 0) if saved_frozen is None else saved_frozen)
    if not ckpt:
        return
    mismatch = runlog.state_dict_mismatch(run.model.state_dict(), ckpt["model"])
    if mismatch:
        raise RunError(f"resume: the checkpoint's weights do not fit this {cfg.model} ({mismatch}); "
                       f"was it saved with other model settings (e.g. batchnorm)?")
    try:
        run.model.load_state_dict(ckpt["model"])
        run.optimizer.load_state_dict(ckpt["optimizer"])
    except (RuntimeError, ValueError, KeyError) as exc:
        raise RunError(f"resume: checkpoint does not fit this model/optimizer "
                       f"({str(exc).splitlines()[0]})") from None
    if run.scaler is not None and "scaler" in ckpt:
        run.scaler.load_state_dict(ckpt["scaler"])


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
        restore_rank_buffers(run)
    run.loader.reshard(sync.worker_rank, sync.workers)  # shards for the ranks that train
    run.updates_per_epoch = math.ceil(len(run.loader) / cfg.accumulation_steps)
    run.schedule = engine.LrSchedule(cfg, sync.size, run.updates_per_epoch)


def rank_buffers(model: torch.nn.Module) -> dict:
    """This rank's buffers (BatchNorm's running statistics, its own until the next evaluation)."""
    return {name: b.detach().cpu().clone() for name, b in model.named_buffers()}


def restore_rank_buffers(run: Training) -> None:
    """A run preempted mid-epoch: each rank takes back its own BatchNorm statistics (the state's
    first broadcast gave it rank 0's), when the world is the same size as when it stopped."""
    saved = (run.resume_at or {}).get("rank_buffers")
    if not saved or len(saved) != run.sync.size:
        return
    own = saved[run.sync.rank]
    with torch.no_grad():
        for name, b in run.model.named_buffers():
            b.copy_(own[name])


def write_start_files(run: Training) -> float:
    """Rank 0: config.yaml (a resumed run may have changed e.g. epochs: the folder's config says
    what ran), and meta.json or, on resume, the metrics cut back to the checkpoint. Returns the
    run's wall time before this start."""
    cfg, sync, run_dir = run.cfg, run.sync, run.run_dir
    cfg.save(os.path.join(run_dir, "config.yaml"))
    if not cfg.resume:
        runlog.write_json(os.path.join(run_dir, "meta.json"),
                          runlog.run_metadata(sync.size, list(run.hostnames), sync.name, str(run.device)))
        return 0.0
    runlog.truncate_metrics(run_dir, run.start_epoch)
    runlog.remove_stale_temp_files(run_dir)
    if run.resume_at:  # preempted mid-epoch: the time until then
        return run.resume_at["elapsed_s"]
    kept = runlog.read_metrics(run_dir)
    saved = run.resume_record
    if saved and (not kept or kept[-1]["epoch"] < saved["epoch"]):
        # Killed after the checkpoint was written and before its metrics line was (record_epoch).
        runlog.append_metrics(run_dir, saved)
        kept.append(saved)
    return kept[-1].get("elapsed_s", 0.0) if kept else 0.0


def first_start(run: Training) -> None:
    cfg, sync, run_dir = run.cfg, run.sync, run.run_dir
    # A write that fails on rank 0 (full disk) stops every rank with rank 0's one line. Elastic:
    # no collective here (a worker that joins later runs this alone).
    if sync.elastic:
        run.elapsed_before = write_start_files(run) if run.is_main else 0.0
    else:
        run.elapsed_before = on_main(sync, lambda: write_start_files(run))
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
        measured = Measured(nic.interface, nic.stop(), *usage.stop())
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


@dataclass
class Measured:
    """What this rank's meters read around one epoch's training."""
    interface: str | None                # the NIC counted (one rank per host), else None
    nic_bytes: tuple[int, int]           # (received, sent) on it
    rank_figures: list[float]            # resources.RANK_FIELDS of this process
    host_cpu_percent: float | None       # the host's CPUs (one rank per host), else None


def reduce_epoch(run: Training, state, result: engine.EpochResult, measured: Measured):
    """The epoch's figures over all ranks, by the epoch end's collectives: one allgather (each
    host's NIC bytes and CPU), the sums' allreduce, and one allreduce of every rank's phase times
    with its resource figures in its own slot. Returns (the epoch's SUMS, images of this pass,
    the metrics line's measured figures)."""
    sync = run.sync
    host = (socket.gethostname(), measured.interface, *measured.nic_bytes, measured.host_cpu_percent)
    per_host = [entry for entry in sync.allgather_object(host if measured.host_cpu_percent is not None else None)
                if entry]  # (host, interface, rx, tx, cpu %)
    nic = [entry for entry in per_host if entry[1]]
    reduced = sync.allreduce_sum(result.sums.cpu())
    # Each rank timed its own phases (0 where a rank does not train); report the mean over the
    # ranks that train, which adds up to the step time.
    own = torch.cat([torch.tensor([result.phase_times[p] for p in engine.PHASES], dtype=torch.float64),
                     resources.pack(measured.rank_figures, sync.rank, sync.size)])
    summed = sync.allreduce_sum(own)
    phase_times = summed[:len(engine.PHASES)] / sync.workers
    return state.epoch_sums(reduced), reduced[2].item(), {
        **{f"{phase}_time_s": phase_times[j].item() for j, phase in enumerate(engine.PHASES)},
        "nic_interface": {h: iface for h, iface, *_ in nic},
        "nic_rx_bytes": {h: rx for h, _, rx, _, _ in nic},
        "nic_tx_bytes": {h: tx for h, _, _, tx, _ in nic},
        **resources.record(summed[len(engine.PHASES):], sync.size, run.device.type == "cuda",
                           {h: cpu for h, *_, cpu in per_host}),
    }


def evaluate_and_record(run: Training, state, epoch: int, result: engine.EpochResult, measured: Measured,
                        checkpoint: bool):
    """Sums, phase and resource figures over all ranks, the test set, the checkpoint when
    ``checkpoint``, one metrics line (written, then printed)."""
    sync, cfg = run.sync, run.cfg
    sums, pass_images, figures = reduce_epoch(run, state, result, measured)  # pass: since this pass over the epoch began
    eval_start = time.perf_counter()
    sync.consolidate(run.model, run.optimizer)  # one model on every rank (BatchNorm statistics averaged)
    test = engine.evaluate(run)
    loss, correct, images, correct5 = sums.tolist()
    engine.Diverged.check_epoch(loss / images, test.loss, run.dataset.num_classes, epoch, result.steps, result.lr)
    wire = sync.wire_bytes_per_sync(run.payload_bytes)
    record = {
        "epoch": epoch, "lr": result.lr,
        "train_loss": loss / images, "train_acc": correct / images, "train_acc5": correct5 / images,
        "test_loss": test.loss, "test_acc": test.acc, "test_acc5": test.acc5,
        "epoch_time_s": result.time_s, "eval_time_s": time.perf_counter() - eval_start,
        "elapsed_s": run.elapsed_s(),
        "images_per_s": pass_images / result.time_s, "steps": result.steps, "syncs": result.syncs,
        "step_time_s": result.time_s / (result.steps - result.first_step),
        "comm_bytes_per_sync": wire, "comm_bytes_per_rank": wire * result.syncs,
        "comm_bytes_per_sync_unfrozen": sync.wire_bytes_per_sync(run.unfrozen_payload_bytes),
        **figures,  # phase times, NIC bytes, resources
        "trainable_params": run.trainable, "frozen_blocks": run.frozen, "world_size": sync.size,
        **run.freezing.record(),  # freeze: auto: its measure per block
        "sync": cfg.sync, "fp16_allreduce": cfg.fp16_allreduce,
        "accumulation_steps": cfg.accumulation_steps, "batch_size": cfg.batch_size,
        **result.extra,  # what only some methods measure (mpi-async-ps: staleness, server updates/s)
    }
    if result.first_step:  # elastic: the epoch was continued after a reset at step `first`
        record["resumed_at_step"] = result.first_step
    # Data first, print second; rank 0's write error stops every rank.
    record = on_main(sync, lambda: checkpoint_and_record(run, epoch, record, checkpoint))
    run.log(f"epoch {epoch + 1}/{cfg.epochs}  train loss {record['train_loss']:.4f} acc {record['train_acc']:.4f}"
            f"  test loss {test.loss:.4f} acc {test.acc:.4f}  {result.time_s:.1f} s  "
            f"{record['images_per_s']:.0f} img/s  lr {record['lr']:.4g}")
    return record, test.confusion


def checkpoint_and_record(run: Training, epoch: int, record: dict, checkpoint: bool) -> dict:
    """Rank 0: the epoch's checkpoint when one is due, then its metrics line, then TensorBoard's
    copy of the line. The checkpoint goes first so that the line can say what writing it took
    (``checkpoint_time_s``, absent in epochs without one); it carries the line (without that
    figure), so that a job killed between the two gets the line back on resume."""
    if checkpoint:
        began = time.perf_counter()
        save_checkpoint(run, epoch, record=record)
        record = {**record, "checkpoint_time_s": time.perf_counter() - began}
    runlog.record_epoch(run.run_dir, record)
    if run.cfg.tensorboard:
        run.board = run.board or tboard.Board(run.run_dir, first_epoch=epoch)
        run.board.epoch(record)
    return record


def save_checkpoint(run: Training, epoch: int, position: dict | None = None, record: dict | None = None) -> None:
    """``epoch`` is done, and ``record`` its metrics line; or, with ``position`` (a preempted
    run), is under way from there."""
    ckpt = {"epoch": epoch if position else epoch + 1, "identity": run.identity, "config": run.cfg.to_dict(),
            "model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
            "frozen_blocks": run.frozen, "freezing": run.freezing.state_dict()}
    if position:
        ckpt["position"] = position
    if record:
        ckpt["record"] = record
    if run.scaler is not None:
        ckpt["scaler"] = run.scaler.state_dict()
    runlog.save_checkpoint(run.run_dir, ckpt)


def save_preempted(run: Training, state, stop: preempt.Preempted, buffers: list[dict]) -> None:
    """Rank 0: the checkpoint of where the epoch stands (the state's step, position and the
    epoch's sums over all ranks so far, every rank's ``buffers``), then the events.jsonl line."""
    elapsed = run.elapsed_s()
    save_checkpoint(run, state.epoch, {"step": state.step, "position": state.position, "totals": state.totals,
                                       "world_size": run.sync.size, "rank_buffers": buffers,
                                       "elapsed_s": elapsed})
    runlog.append_metrics(run.run_dir, stop.event(elapsed), runlog.EVENTS)


def finish(run: Training, confusion, record: dict | None) -> None:
    """Data-parallel ranks must end with identical parameters; say so (or not) in eval.json,
    with the classification report of the run's last epoch (``confusion``, ``record``)."""
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in run.model.parameters()))
    ranks_agree = len(set(run.sync.allgather_object(digest.hexdigest()))) == 1
    if not ranks_agree:
        run.log("WARNING: ranks finished with different parameters")
    if confusion is None or not run.is_main:
        return
    report_text, report = classification_summary(confusion)
    test_acc = confusion.diag().sum().item() / confusion.sum().item()
    runlog.write_json(os.path.join(run.run_dir, "eval.json"), {
        "test_acc": test_acc, "test_acc5": record["test_acc5"], "test_loss": record["test_loss"],
        "classes": run.dataset.num_classes,
        **runs.time_to_target(runlog.read_metrics(run.run_dir), run.cfg.target_acc),
        "confusion_matrix": confusion.tolist(), "classification_report": report,
        "parameters_identical_across_ranks": ranks_agree})
    run.log("classification report (test set):\n" + report_text)
    run.log("confusion matrix (rows: true class, columns: predicted):\n" + format_matrix(confusion))
    if run.board:  # this process recorded epochs into TensorBoard: the config, with the final accuracy
        run.board.hparams(run.cfg.to_dict())
    run.log(f"final test accuracy {test_acc:.4f}; run folder {run.run_dir}")


def classification_summary(confusion: torch.Tensor) -> tuple[str, dict]:
    """scikit-learn's report, from (true, predicted) pairs rebuilt from the confusion matrix."""
    import numpy as np
    from sklearn.metrics import classification_report

    k = confusion.shape[0]
    pairs = np.repeat(np.arange(k * k), confusion.flatten().numpy())
    y_true, y_pred = pairs // k, pairs % k
    labels = list(range(k))
    text = classification_report(y_true, y_pred, labels=labels, digits=4, zero_division=0)
    as_dict = classification_report(y_true, y_pred, labels=labels, output_dict=True, zero_division=0)
    return text, as_dict


def format_matrix(m: torch.Tensor) -> str:
    width = max(len(str(int(m.max()))), 3)
    head = " " * 5 + " ".join(f"{j:>{width}}" for j in range(m.shape[1]))
    rows = [f"{i:>4} " + " ".join(f"{int(v):>{width}}" for v in row) for i, row in enumerate(m.tolist())]
    return "\n".join([head, *rows])


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
        # No rank may exit before rank 0 has saved: the launcher ends the job at the first exit.
        buffers = sync.allgather_object(rank_buffers(training.model))  # each rank's BatchNorm statistics
        on_main(sync, lambda: save_preempted(training, state, exc, buffers))
        # Without its traceback, which holds the loop's frames and in them the wrapped model.
        stopped, exc.run_dir = exc.with_traceback(None), training.run_dir
    # The wrappers the sync method made hold its communication resources (DDP's reducer holds
    # the process group): let them go before the method closes.
    training.net = training.optimizer = state = None
    sync.close()
    return sync, stopped


def say_once(rank: int, line: str, code: int) -> int:
    """What every rank knows alike is said once, by rank 0; returns ``code``."""
    if rank == 0:  # one write: launchers that tag output lines would tag a lone newline too
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    else:
        # Launchers stop the whole job when the first rank exits non-zero. A silent rank that
        # got there first would have rank 0 killed before it said why; so the others give
        # rank 0 time to speak. Normally rank 0 exits first and the launcher ends the job
        # then, so this wait costs nothing.
        time.sleep(SILENT_RANK_EXIT_DELAY_S)
    return code


def main(argv: list[str] | None = None) -> tuple[int, bool]:
    """Run, and turn whatever ends it into (exit status, whether native threads were left)."""
    argv = sys.argv[1:] if argv is None else argv
    rank = lifecycle.launch_rank()
    try:
        sync, stopped = run(load_config(argv))
        if stopped:  # every rank knows it alike, and rank 0's checkpoint is written
            return say_once(rank, stopped.line(), preempt.EXIT_PREEMPTED), sync.leaves_threads_running
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
    return 1, False


if __name__ == "__main__":
    lifecycle.exit_process(*main())
