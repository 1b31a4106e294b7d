"""A run's numbers as every table shows them (reports, comparisons, bench, predict): a metric
of an epoch record, means over the steady-state epochs, the summary row of a run, and speedups
against the np=1 run of the same configuration. No torch, no plotting: reading and counting only.

How the numbers are made:
* "steady-state" epochs are all epochs but the first one recorded, when a run has two or
  more; the first epoch holds the warm-up (allocator, first allreduces, thread pools) and
  is slower. A run with one epoch has only that one. Means over epochs use these epochs.
* img/s over several epochs is (images) / (seconds), summed over the steady-state epochs,
  counting the images of all ranks.
* speedup = img/s of a run / img/s of the run with world size 1 of the same configuration
  (core.names.RUN_IDENTITY: model, dataset and the data set's own keys (``data``: the generated
  set's sizes and seed, the synthetic set's size), batch size per rank, sync, compression,
  accumulation steps, freeze, precision, and the other keys that change how a step runs
  (``options``: a scheme's own settings, the sync method's own, BatchNorm, augmentation)) among
  the inputs (the first one given, if several); efficiency = speedup / world size.
  A run whose precision ``compute: auto`` chose and that has no such run is measured against
  the np=1 run of the same configuration whose precision auto chose too, whatever it chose: the
  row names its ``speedup_baseline``, and ``compute_notes`` says where the two computed otherwise.
  Throughput rather than epoch time, because with --max-steps-per-epoch each rank runs the
  same number of steps whatever the world size, so an epoch holds N times more images.
* per-rank and per-host figures (``{rank or host: value}`` in metrics.jsonl: CPU, memory, NIC
  counters) read as their mean over the ranks or hosts in the tables; the resources figure
  draws each rank's own line.
* bytes are the gradient bytes one rank sends (``comm_bytes_per_rank`` in metrics.jsonl,
  counted by the sync method), 1 MB = 10^6 bytes.
* time to target = ``elapsed_s`` (wall time since the run started: set-up, training and
  evaluation, continued across resumes) of the first epoch whose test accuracy reached the
  run's ``target_acc``, and epochs to target its count (eval.json's ``time_to_target_s`` and
  ``epochs_to_target``; for a run without eval.json, found in metrics.jsonl the same way).
  Time-to-target speedup = np=1's time to target / the run's, against the np=1 run of the
  same configuration and target, and only when both reached the target.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any, Callable, Iterable

from hvd_cifar.core import methods, schemes
from hvd_cifar.core.config import COMPUTE_SETTINGS, FIELDS
from hvd_cifar.core.names import RUN_IDENTITY
from hvd_cifar.runfolder import reader
from hvd_cifar.runfolder.reader import TARGET_KEYS, Run

MB = 1e6  # bytes
# The data set's own keys, by data set (the others are read from files and have none).
DATA_KEYS = {"shapes": ("shapes_train", "shapes_test", "shapes_seed"), "synthetic": ("synthetic_size",)}
# Keys outside the identity's named ones that change what a step computes, when they are not at
# their default: the model's BatchNorm, augmentation.
WORK_KEYS = ("batchnorm", "augment")


def value(record: dict, key: str) -> float:
    """A numeric metric, or NaN when the record lacks it (older runs, optional keys). A per-host
    figure (``{host: bytes}``, the NIC counters) reads as its mean over the hosts."""
    v = record.get(key)
    if isinstance(v, dict):
        numbers = [value(v, host) for host in v]
        return sum(numbers) / len(numbers) if numbers else math.nan
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def steady_epochs(records: list[dict]) -> list[dict]:
    """All epochs but the first (warm-up), when there are two or more."""
    return records[1:] if len(records) >= 2 else records


def _ratio(num: Iterable[float], den: Iterable[float]) -> float:
    n, d = sum(num), sum(den)
    return n / d if d and not math.isnan(d) else math.nan


def steady_mean(records: list[dict], key: str) -> float:
    """Mean of a metric over the steady-state epochs (per epoch)."""
    steady = steady_epochs(records)
    return sum(value(r, key) for r in steady) / len(steady)


def steady_nic_mean(records: list[dict], direction: str) -> float:
    """Bytes through the NIC per steady-state epoch (``direction``: tx or rx), mean over the
    hosts that counted them (``nic_tx_bytes`` / ``nic_rx_bytes``: host -> bytes)."""
    steady = steady_epochs(records)
    return sum(sum(r[f"nic_{direction}_bytes"].values()) / len(r[f"nic_{direction}_bytes"])
               for r in steady) / len(steady)


def present_mean(records: list[dict], key: str) -> float:
    """Mean of a metric over the epochs that have it (checkpoint_time_s: those that wrote one);
    NaN when none has."""
    present = [value(r, key) for r in records if not math.isnan(value(r, key))]
    return sum(present) / len(present) if present else math.nan


def rank_max(records: list[dict], key: str) -> float:
    """The largest per-rank figure (``{rank: value}``) of any rank in any epoch; NaN when none."""
    figures = [value(r[key], rank) for r in records if isinstance(r.get(key), dict) for rank in r[key]]
    return max(figures, default=math.nan)


def steady_per_step(records: list[dict], key: str) -> float:
    """A metric summed over the steady-state epochs, per training step of those epochs."""
    steady = steady_epochs(records)
    return _ratio((value(r, key) for r in steady), (value(r, "steps") for r in steady))


def run_bytes(records: list[dict]) -> dict:
    """Gradient bytes per rank over the whole run (every epoch, the first included): ``bytes``
    as the sync method counted them, ``unfrozen_bytes`` what the same synchronisations would
    have sent with nothing frozen, ``saved_fraction`` the share freezing saved (NaN for one
    rank or runs older than ``comm_bytes_per_sync_unfrozen``), and the NIC's measured
    ``nic_tx_bytes`` / ``nic_rx_bytes`` (mean over the hosts; NaN without counters)."""
    sent = sum(value(r, "comm_bytes_per_rank") for r in records)
    unfrozen = sum(value(r, "comm_bytes_per_sync_unfrozen") * value(r, "syncs") for r in records)
    return {"bytes": sent, "unfrozen_bytes": unfrozen,
            "saved_fraction": 1 - sent / unfrozen if unfrozen else math.nan,
            "nic_tx_bytes": sum(value(r, "nic_tx_bytes") for r in records),
            "nic_rx_bytes": sum(value(r, "nic_rx_bytes") for r in records)}


def setting(run: Run, key: str) -> Any:
    """A run's setting: config.yaml first, then what the last epoch record says."""
    last = run.metrics[-1]
    if key == "world_size":
        return last.get("world_size", run.meta.get("world_size"))
    if key == "freeze":
        freeze = run.config.get("freeze", last.get("frozen_blocks"))
        schedule = run.config.get("freeze_schedule") or {}
        return f"{freeze} {json.dumps(schedule, sort_keys=True)}" if schedule else freeze
    if key in ("compression", "amp"):  # a run saved before the key had none
        return run.config.get(key, "none")
    if key == "data":
        return data_keys(run.config)
    if key == "options":
        return work_options(run.config)
    return run.config.get(key, last.get(key))


def _saved(config: dict, key: str) -> Any:
    """A key of a saved config.yaml, or its default when the run was saved before it existed."""
    return config.get(key, FIELDS[key].default)


def data_keys(config: dict) -> str:
    """The data set's own keys as one cell (``shapes_train=500, shapes_test=100, shapes_seed=0``);
    '' for a data set read from files."""
    dataset = config.get("dataset")
    return ", ".join(f"{k}={_saved(config, k)}" for k in (DATA_KEYS.get(dataset, ()) if isinstance(dataset, str) else ()))


def work_options(config: dict) -> str:
    """The keys beside the identity's named ones that change the work, where they are not at their
    default, as one cell: WORK_KEYS, the scheme's own settings (and the warm-up of one that
    replaces averaging), the sync method's own settings (core.methods: the parameter servers,
    Horovod's tuning); '' when there are none."""
    keys = [k for k in WORK_KEYS if _saved(config, k) != FIELDS[k].default]
    compression, sync = config.get("compression", "none"), config.get("sync")
    if compression in schemes.names():
        keys += [k for k, default in schemes.defaults(compression).items() if config.get(k, default) != default]
        if (schemes.replaces_averaging(compression)
                and _saved(config, "compression_warmup_steps") != FIELDS["compression_warmup_steps"].default):
            keys.append("compression_warmup_steps")
    if sync in methods.METHODS:
        keys += [k for k, s in methods.METHODS[sync].settings.items() if config.get(k, s.default) != s.default]
    return ", ".join(f"{k}={config.get(k)}" for k in keys)


def compute_of(run: Run) -> tuple[str, bool]:
    """The precision and layout a run computed in (config.yaml's resolved ``compute``; for a run
    saved before it, its amp and channels_last) and whether ``compute: auto`` chose it
    (meta.json's ``compute_choice``)."""
    choice = run.meta.get("compute_choice")
    how = choice.get("how") if isinstance(choice, dict) else None
    setting_ = run.config.get("compute")
    if not isinstance(setting_, str) or setting_ not in COMPUTE_SETTINGS:
        given = (run.config.get("amp", "none"), bool(run.config.get("channels_last", False)))
        setting_ = next((s for s, v in COMPUTE_SETTINGS.items() if v == given), str(setting_))
    return setting_, isinstance(how, str) and how.startswith("auto")


def time_to_target(run: Run) -> dict:
    """The run's target test accuracy and the epochs and wall time it took to reach it (see the
    module doc): eval.json's, as the trainer wrote them at the end; for a run without them
    (unfinished, or older than these keys), found in metrics.jsonl by the trainer's own rule."""
    if run.evaluation and all(k in run.evaluation for k in TARGET_KEYS):
        return {k: run.evaluation[k] for k in TARGET_KEYS}
    target = run.config.get("target_acc") or 0.0
    return reader.time_to_target([r for r in run.metrics if "test_acc" in r], target)


def summarize(run: Run) -> dict:
    """One row of numbers for a run; averages are over steady-state epochs (see module doc)."""
    m = run.metrics
    steady = steady_epochs(m)
    images = [value(r, "images_per_s") * value(r, "epoch_time_s") for r in steady]
    row = {"run": run.name, **{k: setting(run, k) for k in RUN_IDENTITY}}
    row["compute"], row["compute_auto"] = compute_of(run)
    row.update({
        "world_size": setting(run, "world_size"),
        "epochs": len(m),
        "mean_epoch_time_s": steady_mean(m, "epoch_time_s"),
        "total_epoch_time_s": sum(value(r, "epoch_time_s") for r in m),
        "images_per_s": _ratio(images, (value(r, "epoch_time_s") for r in steady)),
        "step_time_s": steady_per_step(m, "epoch_time_s"),
        "step_time_median_s": steady_median(steady, "step_time_median_s"),
        "sync_time_per_step_s": steady_per_step(m, "sync_time_s"),
        "bytes_per_epoch_per_rank": steady_mean(m, "comm_bytes_per_rank"),
        "bytes_per_step_per_rank": steady_per_step(m, "comm_bytes_per_rank"),
        "cpu_s_per_image": steady_mean(m, "cpu_s_per_image"),  # the mean over the ranks; NaN before the field
        "final_test_acc": value(m[-1], "test_acc"),
        "final_test_acc5": value(m[-1], "test_acc5"),
        "final_train_acc": value(m[-1], "train_acc"),
        "final_train_acc5": value(m[-1], "train_acc5"),
        "elapsed_s": value(m[-1], "elapsed_s"),
        **time_to_target(run),
        "path": run.path,
    })
    return row


def steady_median(steady: list[dict], key: str) -> float:
    """The median of the steady epochs' ``key`` (each epoch's median per-step time: the median
    of the medians); NaN when no epoch has it."""
    values = [r[key] for r in steady if key in r]
    return statistics.median(values) if values else math.nan


def config_key(row: dict) -> tuple:
    return tuple(str(row.get(k)) for k in RUN_IDENTITY)


def _auto_key(row: dict) -> tuple:
    """The configuration but for the precision, for a run whose precision compute: auto chose."""
    return tuple(str(row.get(k)) for k in RUN_IDENTITY if k != "amp")


def baselines(rows: list[dict], usable: Callable[[dict], bool],
              also: Callable[[dict], Any] = lambda row: None) -> list[dict | None]:
    """Each row's np=1 row (None: none): the first ``usable`` world-size-1 row of the same
    configuration (and the same ``also``); for a row whose precision compute: auto chose,
    failing that, the first such row of the same configuration but for the precision, which
    compute: auto chose too (its choice may differ by world size: ``compute_notes`` says so)."""
    exact: dict[tuple, dict] = {}
    auto: dict[tuple, dict] = {}
    for row in rows:
        if row.get("world_size") == 1 and usable(row):
            exact.setdefault((config_key(row), also(row)), row)
            if row.get("compute_auto"):
                auto.setdefault((_auto_key(row), also(row)), row)
    return [exact.get((config_key(r), also(r))) or (auto.get((_auto_key(r), also(r))) if r.get("compute_auto") else None)
            for r in rows]


def add_speedup(rows: list[dict]) -> None:
    """Fill ``speedup`` and ``efficiency`` in place against each row's np=1 row (``baselines``),
    named in ``speedup_baseline``; NaN where there is none (or the row has no throughput).
    ``compute_differs``: the two computed in another precision or layout."""
    has_rate = lambda row: not math.isnan(row.get("images_per_s", math.nan))
    for row, base in zip(rows, baselines(rows, has_rate)):
        ips, n = row.get("images_per_s", math.nan), row.get("world_size")
        if base and base["images_per_s"] and isinstance(n, int) and not math.isnan(ips):
            row["speedup"] = ips / base["images_per_s"]
            row["efficiency"] = row["speedup"] / n
        else:
            row["speedup"] = row["efficiency"] = math.nan
        row["speedup_baseline"] = base.get("run", "") if base and not math.isnan(row["speedup"]) else ""
        row["compute_differs"] = bool(row["speedup_baseline"]) and base.get("compute") != row.get("compute")
    add_target_speedup(rows)


def compute_notes(rows: list[dict]) -> list[str]:
    """One line per np=1 run that runs computing otherwise have their speed-up against
    (``add_speedup``: compute: auto may choose differently by world size), naming the runs and
    their choices; none when every speed-up is between runs that computed alike."""
    by_name = {row.get("run"): row for row in rows}
    differ: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("compute_differs") and row.get("speedup_baseline") in by_name:
            differ.setdefault(row["speedup_baseline"], []).append(row)

    def said(row: dict) -> str:
        how = " (chosen by compute: auto)" if row.get("compute_auto") else ""
        return f"{row['run']} (np={row.get('world_size')}) {row.get('compute')}{how}"
    return [f"compute differs between runs compared: {said(by_name[base])} against "
            f"{'; '.join(said(r) for r in others)}; the speed-up includes that difference "
            f"(the same --compute for each compares like with like).\n" for base, others in differ.items()]


def add_target_speedup(rows: list[dict]) -> None:
    """Fill ``target_speedup`` in place: time to target of the row's np=1 row of the same target
    (``baselines``) / the row's; NaN unless both reached the target, with
    ``target_speedup_note`` saying why ('' when there is a number, and for rows without the
    target keys: a failed bench job)."""
    bases = baselines(rows, lambda row: bool(row.get("target_acc")), also=lambda row: row.get("target_acc"))
    for row, base in zip(rows, bases):
        note = target_speedup_note(row, base) if "target_acc" in row else ""
        reached = "target_acc" in row and not note
        row["target_speedup"] = base["time_to_target_s"] / row["time_to_target_s"] if reached else math.nan
        row["target_speedup_note"] = note


def target_speedup_note(row: dict, base: dict | None) -> str:
    """Why ``row`` has no time-to-target speedup against its np=1 row ``base`` ('' if it has one)."""
    if not row.get("target_acc"):
        return "no target"
    if base is None:
        return "no np=1 result"
    if row.get("time_to_target_s") is None:
        return "not reached"
    if base.get("time_to_target_s") is None:
        return "np=1 did not reach it"
    return ""


def compare_rows(runs: list[Run]) -> list[dict]:
    """The summary rows of several runs, with their speedups; a folder name that several runs
    share is told apart by its parent's."""
    rows = [summarize(run) for run in runs]
    names = [r["run"] for r in rows]
    for run, row in zip(runs, rows):  # same folder name under different parents: say which
        if names.count(row["run"]) > 1:
            row["run"] = os.path.join(os.path.basename(os.path.dirname(run.path)), row["run"])
    add_speedup(rows)
    return rows


def scaling_groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows with a throughput, by configuration, each group sorted by world size."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if isinstance(row.get("world_size"), int) and not math.isnan(row.get("images_per_s", math.nan)):
            groups.setdefault(config_key(row), []).append(row)
    return {k: sorted(v, key=lambda r: r["world_size"]) for k, v in groups.items()}


def per_name(records: list[dict], key: str) -> dict[str, list[float]]:
    """A per-rank or per-host figure as {rank or host: its value per epoch} (NaN in epochs
    without it), ranks in numeric order."""
    names = sorted({n for r in records if isinstance(r.get(key), dict) for n in r[key]}, key=lambda n: (len(n), n))
    return {n: [value(r.get(key) or {}, n) for r in records] for n in names}
