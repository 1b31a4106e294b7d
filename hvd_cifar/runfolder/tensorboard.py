"""TensorBoard's copy of a run's metrics, written by rank 0 into the run folder::

    tensorboard --logdir logs

metrics.jsonl stays the source of truth: ``Board.epoch`` writes an epoch's record after it was
appended there, every number of it as a scalar at step = epoch. A tag is the record's key under
a group (``tag``: ``accuracy/test_acc``, ``time/sync_time_s``); a per-rank or per-host figure
(``{rank or host: value}``) is one tag each (``resources/cpu_percent/1``), a per-block list one
tag per block; text, booleans and missing values (None) are not scalars and are left out. At the
end of a finished run ``Board.hparams`` adds the config as TensorBoard hparams, whose metrics are
the final test accuracy's scalars (top-1 and top-5). A resumed run opens a new event file in the
same folder; its ``purge_step`` hides what an earlier process wrote for the epochs it reruns.
"""
from __future__ import annotations

import json
import math

from hvd_cifar.core.names import RESOURCE_FIELDS

# (group, does a key belong to it), first match wins; every other number goes under "run".
GROUPS = (
    ("loss", lambda key: key.endswith("_loss")),
    ("accuracy", lambda key: "_acc" in key),
    ("resources", lambda key: key in RESOURCE_FIELDS),
    ("throughput", lambda key: key == "images_per_s"),
    ("time", lambda key: key.endswith("_s")),
    ("bytes", lambda key: "bytes" in key),
    ("optimizer", lambda key: key == "lr"),
)
HPARAM_METRICS = ("test_acc", "test_acc5")  # the final epoch's, as the hparams' metrics


def tag(key: str) -> str:
    """The TensorBoard tag of a metrics record's key."""
    group = next((name for name, belongs in GROUPS if belongs(key)), "run")
    return f"{group}/{key}"


def scalars(record: dict) -> dict[str, float]:
    """{tag: value} for every number in a metrics record (see the module doc); ``epoch`` is the step."""
    out = {}
    for key, v in record.items():
        if key in ("epoch", "step_trace"):  # the step; one step's spans, drawn by the report
            continue
        parts = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else [(None, v)]
        for sub, x in parts:
            if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
                out[tag(key) if sub is None else f"{tag(key)}/{sub}"] = float(x)
    return out


class Board:
    """Rank 0's event file writer for one process of a run, opened at the first epoch it records."""

    def __init__(self, run_dir: str, first_epoch: int):
        from torch.utils.tensorboard import SummaryWriter  # here: only rank 0 with tensorboard on needs it

        self.writer = SummaryWriter(run_dir, purge_step=first_epoch)

    def epoch(self, record: dict) -> None:
        for name, x in scalars(record).items():
            self.writer.add_scalar(name, x, record["epoch"])
        self.writer.flush()  # on disk now: a killed job loses nothing it recorded

    def hparams(self, config: dict) -> None:
        """The run's config as hparams (a mapping as its JSON text); the metrics are the scalars of
        HPARAM_METRICS already written, so TensorBoard shows their last (final) values."""
        from torch.utils.tensorboard.summary import hparams

        values = {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
                  for k, v in config.items() if v is not None}
        for summary in hparams(values, {tag(k): 0.0 for k in HPARAM_METRICS}):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
