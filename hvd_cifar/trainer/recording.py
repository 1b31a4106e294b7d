"""What a run records, epoch by epoch and at its end: rank 0 writes the epoch's checkpoint when
one is due, then its metrics line, then TensorBoard's copy of it; at the end every rank's
parameters are compared and rank 0 writes eval.json with the classification report."""
from __future__ import annotations

import time

from hvd_cifar.runfolder import evaluation, writer
from hvd_cifar.runfolder.checkpoint import save_training
from hvd_cifar.runfolder.tensorboard import Board
from hvd_cifar.trainer.context import Training


def checkpoint_and_record(run: Training, epoch: int, record: dict, checkpoint: bool,
                          rank_states: list[dict] | None = None) -> dict:
    """Rank 0: the epoch's checkpoint when one is due, then its metrics line, then TensorBoard's
    copy of the line. The checkpoint goes first so that the line can say what writing it took
    (``checkpoint_time_s``, absent in epochs without one); it carries the line (without that
    figure), so that a job killed between the two gets the line back on resume."""
    if checkpoint:
        began = time.perf_counter()
        save_training(run.run_dir, epoch, record=record, **run.checkpointed(rank_states))
        record = {**record, "checkpoint_time_s": time.perf_counter() - began}
    run.records = writer.record_epoch(run.run_dir, record)
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
