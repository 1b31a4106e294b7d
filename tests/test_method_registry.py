"""A sync method is one file plus one entry in hvd_cifar/core/methods.py: a copy of the package gets
a toy method that way (its module under hvd_cifar/sync/, and its entry appended to ``METHODS``)
and nothing else is edited; then, run from the copy, the config takes ``--sync toy`` and its own
key with its rule, --help lists that key and a run under another method warns it is inert, a
2-rank mpirun job trains with it and ends with identical parameters on every rank, the probe
times its allreduce under its transport, predict and explain price it from that probe file, and
the report shows its runs. A copy whose toy entry names no transport is refused in one line by
predict and by explain.

Red when any of those keeps a list of sync methods of its own instead of the registry (the
config's ``sync`` choices, the probe's methods, predict's transports, explain's fallback)."""
from __future__ import annotations

import csv
import json

import pytest

from conftest import ROOT
from hvd_cifar.analysis import scaling
from package_copy import package_copy as copied, registry_seen, run

# Its allreduce is a Reduce to rank 0 and a Bcast back, in toy_chunks pieces: neither the ring
# of mpi-allreduce nor the point-to-point messages of gather/scatter.
TOY = '''"""toy: every gradient summed on rank 0 (MPI Reduce), the sum broadcast back (Bcast), in
toy_chunks pieces, then divided by the ranks (a test's sync method)."""
from hvd_cifar.sync.mpi import MpiSync


class ToySync(MpiSync):
    def __init__(self, name, chunks):
        super().__init__(name)
        self.chunks = chunks

    def reduce_broadcast(self, flat):
        for piece in flat.chunk(self.chunks):
            buf = piece.numpy()
            if self.rank == 0:
                self.comm.Reduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM, root=0)
            else:
                self.comm.Reduce(buf, None, op=self.MPI.SUM, root=0)
            self.comm.Bcast(buf, root=0)

    def average(self):
        self.reduce_broadcast(self.flat)
        self.flat.div_(self.size)

    def allreduce_sum(self, tensor):
        host = tensor.detach().to("cpu", copy=True).contiguous().reshape(-1)
        self.reduce_broadcast(host)
        return host.view_as(tensor).to(tensor.device)


def create(name, settings=None):
    return ToySync(name, settings.own["toy_chunks"] if settings is not None else 1)
'''
ENTRY = ('    "toy": Method("hvd_cifar.sync.toy", "toy reduce-broadcast", "gradients summed on rank 0 and broadcast '
         'back", settings={"toy_chunks": Setting(int, 1, "pieces each gradient buffer is sent in", at_least(1), '
         '"must be >= 1")}, transports=("toy-reduce-bcast",), probe="allreduce", native=()),\n')
TINY = str(ROOT / "configs" / "tiny.yaml")
SMALL = ["--min-bytes", "4096", "--max-bytes", "200000", "--sizes", "3", "--iters", "2"]


def package_copy(root, entry: str):
    """The package copied under ``root``, with the toy method's file and ``entry`` appended to METHODS."""
    return copied(root, "sync/toy.py", TOY, "core/methods.py", "METHODS: dict[str, Method]", entry)


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    return package_copy(tmp_path_factory.mktemp("pkg"), ENTRY)


@pytest.fixture(scope="module")
def trained(copy):
    """The toy's runs at np=1 and np=2 (mpirun) and a probe of the copy's methods (mpirun, 2 ranks)."""
    logs = copy / "logs"
    for np in (1, 2):
        done = run(copy, ["hvd_cifar.train", "--config", TINY, "--sync", "toy", "--toy-chunks", "3",
                          "--log-dir", str(logs), "--run-name", f"toy{np}", "--no-tensorboard"], np=np, launcher="mpirun")
        assert done.returncode == 0, done.stderr[-3000:]
    probed = run(copy, ["hvd_cifar.probe", *SMALL, "--out", str(copy / "probe.json")], np=2, launcher="mpirun")
    assert probed.returncode == 0, probed.stderr[-3000:]
    return logs, json.loads((copy / "probe.json").read_text())


def test_the_copy_is_what_runs(copy):
    seen = registry_seen(copy, "hvd_cifar.core.methods", "METHODS")
    assert seen.startswith(str(copy)) and "'toy'" in seen, seen


def test_the_config_and_the_help_take_its_key(copy):
    bad = run(copy, ["hvd_cifar.train", "--config", TINY, "--sync", "toy", "--toy-chunks", "0"])
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == "hvd_cifar: error: toy_chunks: must be >= 1, got 0", bad.stderr
    helped = run(copy, ["hvd_cifar.train", "--help"])
    assert "sync: toy" in helped.stdout and "--toy-chunks" in helped.stdout, helped.stdout[-3000:]
    inert = run(copy, ["hvd_cifar.train", "--config", TINY, "--toy-chunks", "2", "--epochs", "1",
                       "--max-steps-per-epoch", "1", "--log-dir", str(copy / "inert")])
    assert inert.returncode == 0, inert.stderr
    assert "toy_chunks: has no effect here" in inert.stderr and "sync is horovod" in inert.stderr, inert.stderr


def test_it_trains_alike_on_every_rank_and_is_probed(trained):
    logs, probe = trained
    evaluation = json.loads((logs / "toy2" / "eval.json").read_text())
    assert evaluation["parameters_identical_across_ranks"] is True
    records = [json.loads(line) for line in (logs / "toy2" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sync"] for r in records if "epoch" in r] == ["toy", "toy"]
    toy = probe["transports"]["toy-reduce-bcast"]  # its entry's transport, timed by its own allreduce
    assert toy["kind"] == "allreduce" and toy["ranks"] == 2 and toy["beta_bytes_per_s"] > 0
    assert list(probe["transports"])[-1] == "toy-reduce-bcast"  # the registry's order: its entry is the last


def test_predict_and_explain_price_it_from_the_probe_and_the_report_shows_it(copy, trained):
    logs, probe = trained
    predicted = run(copy, ["hvd_cifar.predict", str(logs / "toy1"), "--probe", str(copy / "probe.json"),
                           "--np", "2", "4", "--out", str(copy / "predicted")])
    assert predicted.returncode == 0, predicted.stderr
    with open(copy / "predicted" / "predict.csv") as f:
        rows = {r["np"]: r for r in csv.DictReader(f)}
    fit = probe["transports"]["toy-reduce-bcast"]
    link = scaling.Link(fit["alpha_s"], fit["beta_bytes_per_s"], per_op_s=fit["per_op_s"])
    payload = int(rows["4"]["payload_bytes"])
    assert rows["4"]["method"] == "toy" and float(rows["4"]["comm_s_per_sync"]) == pytest.approx(scaling.ring_s(4, payload, link))
    reported = run(copy, ["hvd_cifar.report", str(logs / "toy1"), str(logs / "toy2"), "--out", str(copy / "report")])
    assert reported.returncode == 0, reported.stderr
    text = (copy / "report" / "compare.md").read_text()
    assert "### toy2 (np=2) against toy1" in text and "not explained" not in text, text[-3000:]
    assert "each option would shorten this step: none to compare (its method runs no other compression)" in text
    with open(copy / "report" / "compare.csv") as f:
        compared = {r["run"]: r for r in csv.DictReader(f)}
    assert (compared["toy1"]["sync"], compared["toy2"]["sync"]) == ("toy", "toy")
    assert compared["toy2"]["options"] == "toy_chunks=3"  # its own key, off its default: a configuration of its own


def test_a_method_whose_entry_names_no_transport_is_refused_by_predict_and_explain(tmp_path, trained):
    logs, _ = trained
    unpriced = package_copy(tmp_path, ENTRY.replace('transports=("toy-reduce-bcast",), ', ""))
    predicted = run(unpriced, ["hvd_cifar.predict", str(logs / "toy1"), "--bandwidth", "1gbit", "--np", "2"])
    assert predicted.returncode == 2 and predicted.stderr.count("\n") == 1, predicted.stderr
    assert "sync: toy: the scaling model cannot price it" in predicted.stderr
    reported = run(unpriced, ["hvd_cifar.report", str(logs / "toy1"), str(logs / "toy2"), "--out", str(tmp_path / "report")])
    assert reported.returncode == 0, reported.stderr
    assert "toy2: not explained (sync: toy: the scaling model cannot price it" in (tmp_path / "report" / "compare.md").read_text()
