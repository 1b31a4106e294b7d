"""What a run records, at its start, epoch by epoch and at its end: rank 0 writes the start files
and says where the run stands; after each epoch the ranks reduce its figures and evaluate, rank 0
writes the epoch's checkpoint when one is due, then its metrics line, then TensorBoard's copy of
it, then prints the line; at the end every rank's parameters are compared and rank 0 writes
eval.json with the classification report."""
from __future__ import annotations

import sys
import time

import torch

from hvd_cifar.runfolder import code, evaluation, writer
from hvd_cifar.runfolder.checkpoint import save_training
from hvd_cifar.runfolder.tensorboard import Board
from hvd_cifar.trainer import compute, loop, metrics
from hvd_cifar.trainer.context import Training
from hvd_cifar.trainer.ranks import before_loop, on_main
from hvd_cifar.workload.epoch import EpochResult


def record_start(run: Training) -> None:
    """At the run's first begin. Rank 0: config.yaml, and meta.json or (resumed) the metrics cut
    back to the checkpoint (a write that fails on rank 0, a full disk, stops every rank with
    rank 0's one line); then the run's first lines, its inert keys' warnings, where it resumes."""
    setup, run_dir = run.setup, run.run_dir
    cfg, sync, start = setup.cfg, setup.sync, run.start
    meta = lambda: dict(writer.run_metadata(sync.size, list(run.hostnames), sync.name, str(setup.device)),
                        inert_keys=setup.inert_keys, compute_choice=setup.compute_choice,
                        threads_per_rank=torch.get_num_threads())
    run.elapsed_before = before_loop(sync, lambda: writer.write_start_files(
        run_dir, cfg, start.epoch, start.mid_epoch, start.record, meta), others=lambda: 0.0)
    run.log(f"run folder {run_dir}: {cfg.model} on {cfg.dataset}, {sync.size} rank(s) "
            f"({', '.join(sorted(set(run.hostnames)))}), sync={cfg.sync}, device={setup.device}, "
            f"threads/rank={torch.get_num_threads()}, "
            f"compute={cfg.compute} ({compute.described(setup.compute_choice)})")
    for key, why in setup.inert_keys.items() if run.is_main else ():
        print(f"hvd_cifar: warning: {key}: has no effect here ({why}); the run goes on without it",
              file=sys.stderr, flush=True)
    if cfg.resume and start.mid_epoch:
        run.log(f"resuming epoch {start.epoch + 1} of {cfg.epochs} after step {start.mid_epoch['step']}")
    elif cfg.resume:
        run.log(f"resuming after epoch {start.epoch} of {cfg.epochs}")


def evaluate_and_record(run: Training, state, epoch: int, result: EpochResult, measured: metrics.Measured,
                        checkpoint_due: bool) -> tuple[dict, torch.Tensor]:
    """Sums, phase and resource figures over all ranks, the test set, the checkpoint when
    ``checkpoint_due``, one metrics line (written, then printed). Returns the line and the test
    set's confusion matrix."""
    setup = run.setup
    sync, cfg = setup.sync, setup.cfg
    # pass: since this pass over the epoch began
    sums, pass_images, figures = metrics.reduce_epoch(sync, state, result, measured, setup.device.type == "cuda")
    eval_start = time.perf_counter()
    sync.consolidate(setup.model, run.trainable.optimizer)  # one model on every rank (BatchNorm statistics averaged)
    test = loop.evaluate(run)
    record = metrics.epoch_record(run, epoch, result, sums, pass_images, figures, test,
                                  eval_time_s=time.perf_counter() - eval_start)
    loop.Diverged.check_epoch(record["train_loss"], test.loss, setup.dataset.num_classes, epoch, result.steps,
                              result.lr)
    rank_states = run.rank_states() if checkpoint_due else None  # every rank's, before rank 0 saves them
    # Data first, print second; rank 0's write error stops every rank.
    record = on_main(sync, lambda: checkpoint_and_record(run, epoch, record, checkpoint_due, rank_states))
    run.log(f"epoch {epoch + 1}/{cfg.epochs}  train loss {record['train_loss']:.4f} acc {record['train_acc']:.4f}"
            f"  test loss {test.loss:.4f} acc {test.acc:.4f}  {result.time_s:.1f} s  "
            f"{record['images_per_s']:.0f} img/s  lr {record['lr']:.4g}")
    return record, test.confusion


def checkpoint_and_record(run: Training, epoch: int, record: dict, checkpoint_due: bool,
                          rank_states: list[dict] | None = None) -> dict:
    """Rank 0: the epoch's checkpoint when one is due, then its metrics line, then TensorBoard's
    copy of the line. The checkpoint goes first so that the line can say what writing it took
    (``checkpoint_time_s``, absent in epochs without one); it carries the line (without that
    figure), so that a job killed between the two gets the line back on resume."""
    if checkpoint_due:
        began = time.perf_counter()
        save_training(run.run_dir, epoch, record=record, **run.checkpointed(rank_states))
        record = {**record, "checkpoint_time_s": time.perf_counter() - began}
    run.records = writer.record_epoch(run.run_dir, record)
    if run.setup.cfg.tensorboard:
        run.board = run.board or Board(run.run_dir, first_epoch=epoch)
        run.board.epoch(record)
    return record


def finish(run: Training, confusion, record: dict | None) -> None:
    """Data-parallel ranks must end with identical parameters; say so (or not) in eval.json,
    with the classification report of the run's last epoch (``confusion``, ``record``)."""
    setup = run.setup
    ranks_agree = len(set(setup.sync.allgather_object(evaluation.parameters_digest(setup.model)))) == 1
    if not ranks_agree:
        run.log("WARNING: ranks finished with different parameters")
    code.record(run.run_dir, setup.sync.allgather_object, run.is_main)  # RUN/code.json: the modules the ranks ran
    if confusion is None or not run.is_main:
        return
    test_acc, lines = evaluation.write(run.run_dir, confusion, record, setup.dataset.num_classes, run.records,
                                       setup.cfg.target_acc, ranks_agree)
    for line in lines:
        run.log(line)
    if run.board:  # this process recorded epochs into TensorBoard: the config, with the final accuracy
        run.board.hparams(setup.cfg.to_dict())
    run.log(f"final test accuracy {test_acc:.4f}; run folder {run.run_dir}")
