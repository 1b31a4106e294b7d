"""eval.json: a finished run's test-set verdict, written by rank 0 after the last epoch.

What it holds: the last epoch's test accuracy (top-1 from the confusion matrix, top-5) and
loss, the number of classes, time to ``target_acc`` (from the run's epoch records), the
confusion matrix, scikit-learn's classification report, and whether every rank ended with the
same parameters (data-parallel ranks must).
"""
from __future__ import annotations

import hashlib
import os

from hvd_cifar import runs
from hvd_cifar.files import write_json

EVAL = "eval.json"


def parameters_digest(model) -> str:
    """A hash of ``model``'s parameters, to compare across ranks."""
    digest = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
    return digest.hexdigest()


def write(run_dir: str, confusion, last: dict, classes: int, records: list[dict], target_acc: float,
          ranks_agree: bool) -> tuple[float, list[str]]:
    """RUN_DIR/eval.json from the last epoch's ``confusion`` matrix and metrics line ``last``,
    and the run's epoch ``records``. Returns the test accuracy and the lines to print."""
    report_text, report = classification_summary(confusion)
    test_acc = confusion.diag().sum().item() / confusion.sum().item()
    write_json(os.path.join(run_dir, EVAL), {
        "test_acc": test_acc, "test_acc5": last["test_acc5"], "test_loss": last["test_loss"],
        "classes": classes,
        **runs.time_to_target(records, target_acc),
        "confusion_matrix": confusion.tolist(), "classification_report": report,
        "parameters_identical_across_ranks": ranks_agree})
    return test_acc, ["classification report (test set):\n" + report_text,
                      "confusion matrix (rows: true class, columns: predicted):\n" + format_matrix(confusion)]


def classification_summary(confusion) -> tuple[str, dict]:
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


def format_matrix(m) -> str:
    width = max(len(str(int(m.max()))), 3)
    head = " " * 5 + " ".join(f"{j:>{width}}" for j in range(m.shape[1]))
    rows = [f"{i:>4} " + " ".join(f"{int(v):>{width}}" for v in row) for i, row in enumerate(m.tolist())]
    return "\n".join([head, *rows])
