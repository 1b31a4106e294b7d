"""Run folders written by a test, laid out as hvd_cifar.train writes them (config.yaml, meta.json,
metrics.jsonl with every key an epoch record has, eval.json), with numbers chosen here. Tests of
the readers, the report and the prediction read these instead of training; one real run per
reader stays in its test file, where the trainer's own output is the point.

    write_run(tmp_path / "np2", world_size=2, epochs=3)                  # a finished 2-rank run
    write_run(tmp_path / "np1", records=[epoch_record(e, ...) for ...])  # records of your own
"""
from __future__ import annotations

import json
from pathlib import Path

SMALLCNN_PARAMS = 94_986  # smallcnn's trainable parameters (10 classes)
PAYLOAD_BYTES = SMALLCNN_PARAMS * 4  # its fp32 gradient, bytes per synchronisation
CLASSES = 10
PHASE_SHARES = {"data": 0.05, "forward": 0.25, "backward": 0.45, "sync": 0.15, "optimizer": 0.1}  # of a step


def epoch_record(epoch: int, world_size: int = 1, steps: int = 3, batch_size: int = 32, **changes) -> dict:
    """One metrics.jsonl line as the trainer writes it: accuracy rising and loss falling with the
    epoch, a slower first epoch (warm-up), ring-allreduce bytes of smallcnn's gradient, per-rank
    and per-host figures keyed as JSON keys are (strings). ``changes`` replace or add keys."""
    epoch_time_s = (1.3 if epoch == 0 else 0.9) + 0.01 * world_size
    wire = round(2 * (world_size - 1) / world_size * PAYLOAD_BYTES)
    ranks, hosts = [str(r) for r in range(world_size)], ["node-a"]
    record = {
        "epoch": epoch, "lr": 0.05 * world_size / (epoch + 1),
        "train_loss": 1.6 / (epoch + 1), "train_acc": 0.55 + 0.1 * epoch, "train_acc5": 0.9 + 0.02 * epoch,
        "test_loss": 1.4 / (epoch + 1), "test_acc": 0.6 + 0.1 * epoch + 0.001 * world_size, "test_acc5": 0.95,
        "epoch_time_s": epoch_time_s, "eval_time_s": 0.12, "elapsed_s": 2.5 + 1.1 * (epoch + 1),
        "images_per_s": world_size * batch_size * steps / epoch_time_s, "steps": steps, "syncs": steps,
        "step_time_s": epoch_time_s / steps,
        "comm_bytes_per_sync": wire, "comm_bytes_per_rank": wire * steps, "comm_bytes_per_sync_unfrozen": wire,
        **{f"{p}_time_s": share * epoch_time_s for p, share in PHASE_SHARES.items()},
        "nic_interface": {}, "nic_rx_bytes": {}, "nic_tx_bytes": {},
        "cpu_percent": {r: 95.0 + int(r) for r in ranks}, "rss_bytes": {r: 400_000_000 + epoch for r in ranks},
        "rss_peak_bytes": {r: 450_000_000 + epoch for r in ranks}, "host_cpu_percent": {h: 180.0 for h in hosts},
        "trainable_params": SMALLCNN_PARAMS, "frozen_blocks": 0, "world_size": world_size,
        "sync": "horovod", "fp16_allreduce": False, "accumulation_steps": 1, "batch_size": batch_size,
    }
    return {**record, **changes}


def evaluation(last: dict, target: dict | None = None) -> dict:
    """eval.json for a run whose last epoch record is ``last``: a confusion matrix that gives its
    test accuracy, scikit-learn's report of it, and the time-to-target keys (``target``, as
    hvd_cifar.runfolder.reader.time_to_target gives them; no target by default)."""
    right, support = round(last["test_acc"] * 40), 40
    matrix = [[right if i == j else (support - right if j == (i + 1) % CLASSES else 0) for j in range(CLASSES)]
              for i in range(CLASSES)]
    score = right / support
    per_class = {str(i): {"precision": score, "recall": score, "f1-score": score, "support": float(support)}
                 for i in range(CLASSES)}
    return {"test_acc": score, "test_acc5": last["test_acc5"], "test_loss": last["test_loss"], "classes": CLASSES,
            **(target or {"target_acc": None, "epochs_to_target": None, "time_to_target_s": None}),
            "confusion_matrix": matrix,
            "classification_report": {**per_class, "accuracy": score,
                                      "macro avg": {"precision": score, "recall": score, "f1-score": score,
                                                    "support": float(support * CLASSES)}},
            "parameters_identical_across_ranks": True}


def write_run(folder: Path, records: list[dict] | None = None, *, world_size: int = 1, epochs: int = 3,
              config: dict | None = None, eval_json: bool = True, target: dict | None = None,
              metrics_tail: str = "") -> Path:
    """``folder`` as a run folder: ``records`` (default: ``epochs`` epoch_records at ``world_size``),
    config.yaml (tiny.yaml's settings, ``config`` over them), meta.json, and eval.json unless
    ``eval_json`` is false. ``metrics_tail``: text appended to metrics.jsonl as it is (a torn
    line, say). Returns ``folder``."""
    records = records if records is not None else [epoch_record(e, world_size) for e in range(epochs)]
    world_size = records[-1].get("world_size", world_size) if records else world_size
    folder.mkdir(parents=True)
    settings = {"model": "smallcnn", "dataset": "digits", "batch_size": 32, "sync": "horovod",
                "fp16_allreduce": False, "accumulation_steps": 1, "freeze": 0, "lr": 0.05, "schedule": "cosine",
                "epochs": epochs, "max_steps_per_epoch": 3, "target_acc": 0.0, **(config or {})}
    (folder / "config.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
    (folder / "meta.json").write_text(json.dumps({"world_size": world_size, "hostnames": ["node-a"] * world_size,
                                                  "sync": settings["sync"], "device": "cpu", "launcher": "horovodrun"}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + metrics_tail)
    if eval_json and records:
        (folder / "eval.json").write_text(json.dumps(evaluation(records[-1], target)))
    return folder
