"""cpu_s_per_image: each rank's process CPU seconds per image it trained in the epoch, in
metrics.jsonl per rank, and in the report's comparison per run (the mean over the ranks)."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import md_table, read_metrics, shown
from hvd_cifar import report
from hvd_cifar.analysis.summary import summarize
from hvd_cifar.core.names import PHASES
from hvd_cifar.runfolder.reader import load_run
from hvd_cifar.trainer import metrics, resources
from hvd_cifar.workload.epoch import EpochResult
from runfolders import epoch_record, write_run


class TwoRanks:
    """Rank ``rank`` of two, whose collectives sum its own contribution with ``other``'s."""

    def __init__(self, rank: int, other: list[torch.Tensor]):
        self.rank, self.size, self.workers, self.other = rank, 2, 2, other

    def allgather_object(self, obj):
        return [obj, None]

    def allreduce_sum(self, tensor):
        return tensor + self.other.pop(0)


def result(images: float, cpu_s: float) -> EpochResult:
    return EpochResult(torch.tensor([1.0, 2.0, images, 3.0], dtype=torch.float64), dict.fromkeys(PHASES, 0.1),
                       steps=4, first_step=0, syncs=4, time_s=2.0, lr=0.1, cpu_s=cpu_s)


def test_each_rank_reports_its_own_cpu_seconds_per_trained_image():
    measured = metrics.Measured(None, (0, 0), [150.0, 1e8, 2e8, 0.0], 150.0)
    # Rank 1's contributions, as its own reduce_epoch builds them: 3 s over 64 images.
    theirs = [torch.tensor([0.0, 0.0, 64.0, 0.0], dtype=torch.float64),
              torch.cat([torch.zeros(len(PHASES)), resources.pack([90.0, 1e8, 2e8, 0.0], 1, 2),
                         resources.per_image(3.0, 64, 1, 2)])]
    state = type("State", (), {"epoch_sums": staticmethod(lambda reduced: reduced)})()
    _, images, figures = metrics.reduce_epoch(TwoRanks(0, theirs), state, result(images=128, cpu_s=4.0),
                                              measured, cuda=False)
    assert images == 192
    assert figures["cpu_s_per_image"] == {"0": 4.0 / 128, "1": 3.0 / 64}
    assert figures["cpu_percent"] == {"0": 150.0, "1": 90.0}  # the slots before it are where they were
    assert resources.per_image(5.0, 0, 0, 1).tolist() == [0.0]  # a rank that trained nothing (a server)


def test_the_comparison_shows_the_mean_over_ranks_and_steady_epochs(tmp_path):
    records = [epoch_record(e, world_size=2, cpu_s_per_image={"0": 0.01 * (e + 1), "1": 0.03}) for e in range(3)]
    run = write_run(tmp_path / "np2", records, world_size=2)
    write_run(tmp_path / "np1", epochs=3)  # before the field: shown as missing
    row = summarize(load_run(str(run)))
    assert row["cpu_s_per_image"] == pytest.approx(((0.02 + 0.03) / 2 + (0.03 + 0.03) / 2) / 2)
    assert math.isnan(summarize(load_run(str(tmp_path / "np1")))["cpu_s_per_image"])
    out = tmp_path / "cmp"
    assert report.main([str(tmp_path / "np1"), str(run), "--out", str(out)]) == 0
    table = md_table((out / "compare.md").read_text(), "# Run comparison")
    cells = {r["run"]: r["CPU s/image/rank (excl. first epoch)"] for r in table}
    shown(cells["np2"], row["cpu_s_per_image"], 4)
    assert cells["np1"] == "-"


def test_a_real_run_records_it_for_every_rank(tiny_run):
    for line in read_metrics(tiny_run("single").run):
        cpu = line["cpu_s_per_image"]["0"]
        # Process CPU time per image: at least a few microseconds, and at most what the epoch's
        # wall time at the rank's CPU percentage allows (both read from the same process).
        images = line["images_per_s"] * line["epoch_time_s"]
        assert 1e-6 < cpu <= 1.05 * line["cpu_percent"]["0"] / 100 * line["epoch_time_s"] / images + 1e-3
