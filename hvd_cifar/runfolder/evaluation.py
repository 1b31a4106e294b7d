"""eval.json: a finished run's test-set verdict, written by rank 0 after the last epoch.

What it holds: the last epoch's test accuracy (top-1 from the confusion matrix, top-5) and
loss, the number of classes, time to ``target_acc`` (from the run's epoch records), the
confusion matrix, scikit-learn's classification report, and whether every rank ended with the
same parameters (data-parallel ranks must).
"""
from __future__ import annotations

import hashlib
import os

from hvd_cifar.core.files import write_json
from hvd_cifar.runfolder import reader

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
        **reader.time_to_target(records, target_acc),
        "confusion_matrix": confusion.tolist(), "classification_report": report,
        "parameters_identical_across_ranks": ranks_agree})
    return test_acc, ["classification report (test set):\n" + report_text,
                      "confusion matrix (rows: true class, columns: predicted):\n" + format_matrix(confusion)]


def classification_summary(confusion) -> tuple[str, dict]:
    """Per-class precision, recall, F1 and support, the accuracy, and their macro and
    support-weighted averages, from the confusion matrix (rows: true class): the text and the
    keys of scikit-learn's classification report (4 digits, a class never predicted scoring 0).
    Computed here, in plain Python, so that the trainer never imports scikit-learn (about a
    second of CPU per process)."""
    m = confusion.tolist()
    k = len(m)
    support = [sum(row) for row in m]
    predicted = [sum(m[i][j] for i in range(k)) for j in range(k)]
    total = sum(support)
    report: dict = {}
    for c in range(k):
        tp = m[c][c]
        precision = tp / predicted[c] if predicted[c] else 0.0
        recall = tp / support[c] if support[c] else 0.0
        f1 = 2 * tp / (predicted[c] + support[c]) if predicted[c] + support[c] else 0.0
        report[str(c)] = {"precision": precision, "recall": recall, "f1-score": f1, "support": float(support[c])}
    report["accuracy"] = sum(m[c][c] for c in range(k)) / total if total else 0.0
    scores = ("precision", "recall", "f1-score")
    classes = [report[str(c)] for c in range(k)]
    report["macro avg"] = {**{s: sum(r[s] for r in classes) / k for s in scores}, "support": float(total)}
    report["weighted avg"] = {**{s: sum(r[s] * r["support"] for r in classes) / total if total else 0.0
                                 for s in scores}, "support": float(total)}
    return report_text(report, k), report


def report_text(report: dict, k: int, digits: int = 4) -> str:
    """``report`` laid out as scikit-learn prints its classification report."""
    width = len("weighted avg")
    row = lambda name, r: (f"{name:>{width}} " + "".join(f" {r[s]:>9.{digits}f}" for s in ("precision", "recall", "f1-score"))  # noqa: E731
                           + f" {int(r['support']):>9}\n")
    total = int(report["macro avg"]["support"])
    return (f"{'':>{width}} " + "".join(f" {h:>9}" for h in ("precision", "recall", "f1-score", "support")) + "\n\n"
            + "".join(row(str(c), report[str(c)]) for c in range(k)) + "\n"
            + f"{'accuracy':>{width}} " + f" {'':>9}" * 2 + f" {report['accuracy']:>9.{digits}f} {total:>9}\n"
            + row("macro avg", report["macro avg"]) + row("weighted avg", report["weighted avg"]))


def format_matrix(m) -> str:
    width = max(len(str(int(m.max()))), 3)
    head = " " * 5 + " ".join(f"{j:>{width}}" for j in range(m.shape[1]))
    rows = [f"{i:>4} " + " ".join(f"{int(v):>{width}}" for v in row) for i, row in enumerate(m.tolist())]
    return "\n".join([head, *rows])
