"""compute: auto, the precision and layout chosen for the device a run lands on (hvd_cifar/trainer/
compute.py): the candidates a device and a config allow, the choice, the same choice on every
rank, the bytes on the wire unchanged, bf16 resumed exactly, threads per rank, bad input."""
from __future__ import annotations

import json
import os

import pytest
import torch

from conftest import TINY, read_metrics, run_train
from hvd_cifar.core import config
from hvd_cifar.runfolder import reader
from hvd_cifar.trainer import compute
from hvd_cifar.workload.models import build_model

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own cache of choices (the runs it starts inherit the variable)."""
    monkeypatch.setenv("HVD_CIFAR_CACHE_DIR", str(tmp_path / "cache"))


def cfg(*flags: str) -> config.Config:
    return config.from_args([*flags, "--no-tensorboard"])


def test_a_cpu_without_native_bf16_never_gets_bf16(monkeypatch):
    """Emulated bf16 is slower than fp32: where /proc/cpuinfo has neither avx512_bf16 nor amx_bf16
    the candidates are fp32 in both layouts, and the choice, timed for real on a small model, is
    one of them; with the flags, bf16 joins them."""
    monkeypatch.setattr(compute, "cpu_has_native_bf16", lambda: False)
    assert compute.candidates(cfg(), CPU) == ["fp32", "fp32-channels-last"]
    model = build_model("smallcnn", 10)
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    choice = compute.decide(cfg(), CPU, model, images, labels)
    assert choice["setting"] in ("fp32", "fp32-channels-last") and set(choice["seconds_per_step"]) == {
        "fp32", "fp32-channels-last"}, choice
    monkeypatch.setattr(compute, "cpu_has_native_bf16", lambda: True)
    assert compute.candidates(cfg(), CPU) == ["fp32", "fp32-channels-last", "bf16", "bf16-channels-last"]


def test_the_native_bf16_test_reads_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw\n")
    assert not compute.cpu_has_native_bf16(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert compute.cpu_has_native_bf16(str(info))
    assert not compute.cpu_has_native_bf16(str(tmp_path / "missing"))


def test_given_amp_and_layout_pin_the_candidates_and_schemes_rule_out_fp16(monkeypatch):
    monkeypatch.setattr(compute, "device_candidates",
                        lambda device: ["fp16", "fp16-channels-last", "bf16", "bf16-channels-last", "fp32",
                                        "fp32-channels-last"])  # a GPU's list
    assert compute.candidates(cfg("--amp", "bf16"), CPU) == ["bf16", "bf16-channels-last"]
    assert compute.candidates(cfg("--channels-last"), CPU) == ["fp16-channels-last", "bf16-channels-last",
                                                               "fp32-channels-last"]
    assert not any(c.startswith("fp16") for c in compute.candidates(cfg("--compression", "powersgd"), CPU))
    assert not any(c.startswith("fp16") for c in compute.candidates(cfg("--sync", "mpi-async-ps"), CPU))
    assert compute.candidates(cfg("--local-sgd-steps", "4"), CPU)[0] == "fp16"  # local SGD keeps no residual


def test_the_choice_makes_a_settled_copy_and_leaves_the_config_as_given():
    given = cfg("--compute", "auto")
    used = compute.apply(given, {"setting": "bf16-channels-last", "how": "auto: fastest of 4 timed on this device"})
    assert (given.compute, given.amp, given.channels_last) == ("auto", "none", False)
    assert (used.compute, used.amp, used.channels_last) == ("bf16-channels-last", "bf16", True)
    assert used.resolved()["how"] == {"lr": "0 asks for vgg11's default rate",
                                      "compute": "auto: fastest of 4 timed on this device",
                                      "amp": "from compute: bf16-channels-last",
                                      "channels_last": "from compute: bf16-channels-last"}
    assert used.given()["compute"] == "auto" and used.given()["amp"] == "none"


def test_a_tie_goes_to_the_plainer_setting_and_a_named_setting_is_not_timed():
    assert compute.choose({"fp32": 1.0, "fp32-channels-last": 0.995, "bf16": 1.2}) == "fp32"
    assert compute.choose({"fp32": 1.0, "fp32-channels-last": 0.9, "bf16": 0.6}) == "bf16"
    named = compute.decide(cfg("--compute", "bf16-channels-last"), CPU, None, None, None)
    assert named == {"setting": "bf16-channels-last", "how": "named in the config"}
    fixed = cfg("--compute", "fixed", "--amp", "bf16")
    assert compute.decide(fixed, CPU, None, None, None)["setting"] == "bf16"


@pytest.mark.parametrize("flags, line", [
    (["--compute", "fp8"], "hvd_cifar: error: compute: 'fp8' is not one of auto, fixed, fp32,"),
    (["--amp", "fp16"], "hvd_cifar: error: amp: fp16 autocast needs a GPU, and this run is on the CPU"),
    (["--compute", "fp16-channels-last"], "hvd_cifar: error: compute: fp16 autocast needs a GPU"),
])
def test_a_setting_this_device_cannot_run_is_one_line_naming_the_key(tiny_args, flags, line):
    proc = run_train([*tiny_args, "--compute", "auto", *flags, "--epochs", "1"], launcher="mpirun", np=2, check=False)
    ours = [x for x in proc.stderr.splitlines() if "hvd_cifar:" in x]
    assert proc.returncode == 2 and len(ours) == 1 and line in ours[0], proc.stderr[-2000:]


class FakeSync:
    def __init__(self, size, local_size, others):
        self.size, self.local_size, self.elastic, self.others = size, local_size, False, others

    def allgather_object(self, mine):
        return [mine, *self.others]


def test_threads_follow_the_cpus_a_rank_is_given(monkeypatch):
    """Unbound ranks on one host share its CPUs; a rank bound to its own CPUs uses them all."""
    import socket
    monkeypatch.setattr(compute.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    host = socket.gethostname()
    shared = FakeSync(4, 4, [(host, [0, 1, 2, 3])] * 3)
    assert compute.threads_for_rank(cfg(), shared) == 1
    bound = FakeSync(2, 2, [(host, [4, 5, 6, 7])])
    assert compute.threads_for_rank(cfg(), bound) == 4
    elsewhere = FakeSync(2, 1, [("another-host", [0, 1, 2, 3])])
    assert compute.threads_for_rank(cfg(), elsewhere) == 4
    assert compute.threads_for_rank(cfg("--threads-per-rank", "1"), shared) == 1


def test_auto_is_decided_once_for_every_rank_and_recorded(tmp_path, tiny_args):
    """Two ranks under mpirun with compute: auto: meta.json holds the choice and each candidate's
    seconds per step, resolved.yaml the setting chosen (what a resume continues in), the first
    line says it, both ranks end on the same weights, each rank's threads are the 2 CPUs
    shared by 2 ranks."""
    proc = run_train([*tiny_args, "--compute", "auto", "--epochs", "1"], launcher="mpirun", np=2)
    run = tmp_path / "logs" / "run"
    meta = json.loads((run / "meta.json").read_text())
    choice = meta["compute_choice"]
    assert choice["setting"] in choice["seconds_per_step"] and len(choice["seconds_per_step"]) >= 2, choice
    assert choice["seconds_per_step"][choice["setting"]] <= 1.01 * min(choice["seconds_per_step"].values())
    assert config.load_yaml(str(run / "config.yaml"))["compute"] == "auto"  # as given
    saved = reader.read_config(str(run))
    assert saved["compute"] == choice["setting"]
    assert (saved["amp"], saved["channels_last"]) == config.COMPUTE_SETTINGS[choice["setting"]]
    line = next(x for x in (proc.stdout + proc.stderr).splitlines() if f"compute={choice['setting']} (auto: fastest of" in x)
    assert all(f"{s} " in line for s in choice['seconds_per_step']) and line.endswith("ms per step)"), line
    assert json.loads((run / "eval.json").read_text())["parameters_identical_across_ranks"] is True
    assert meta["threads_per_rank"] == max(1, len(os.sched_getaffinity(0)) // 2)


def test_bf16_sends_the_bytes_fp32_sends_and_fp16_compression_halves_both(tmp_path):
    """Gradients on the wire are the sync method's and the scheme's: bf16 autocast does not
    change them (2 ranks, analytic bytes per sync and the payload)."""
    bytes_of = {}
    for compute_setting in ("fp32", "bf16"):
        for compression in ("none", "fp16"):
            name = f"{compute_setting}-{compression}"
            run_train(["--config", TINY, "--log-dir", str(tmp_path), "--run-name", name, "--epochs", "1",
                       "--max-steps-per-epoch", "2", "--no-tensorboard", "--compute", compute_setting,
                       "--compression", compression], launcher="mpirun", np=2)
            bytes_of[name] = read_metrics(tmp_path / name)[0]["comm_bytes_per_sync"]
    assert bytes_of["fp32-none"] == bytes_of["bf16-none"] > 0, bytes_of
    assert bytes_of["fp32-fp16"] == bytes_of["bf16-fp16"] == bytes_of["fp32-none"] // 2, bytes_of


def test_a_bf16_run_stopped_and_resumed_ends_on_the_straight_runs_weights(tmp_path):
    """bf16 autocast with fp32 master weights and optimizer state: 1 epoch, then resumed for the
    second, ends on the weights of 2 straight epochs, bit for bit."""
    flags = ["--config", TINY, "--log-dir", str(tmp_path), "--epochs", "2", "--no-tensorboard",
             "--compute", "bf16-channels-last"]
    run_train([*flags, "--run-name", "straight"], launcher="mpirun", np=2)
    run_train([*flags, "--run-name", "stopped", "--stop-after", "1"], launcher="mpirun", np=2)
    run_train(["--resume", str(tmp_path / "stopped"), "--stop-after", "0"], launcher="mpirun", np=2)
    a = torch.load(tmp_path / "straight" / "checkpoint_last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "stopped" / "checkpoint_last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert all(v.dtype != torch.bfloat16 for v in a.values())


@pytest.mark.parametrize("flags", [["--amp", "fp16"], ["--compute", "fp16"], ["--compute", "fp16-channels-last"]])
def test_the_cpu_refusals_hints_are_accepted_when_followed(monkeypatch, flags):
    """Each hint of check_device's refusal on a CPU, added to the flags, gives a config and a
    choice this CPU runs (the real run of such a refusal is above)."""
    monkeypatch.setattr(compute, "time_settings", lambda model, images, labels, settings, device:
                        {s: 1.0 for s in settings})  # the choice, not the timing, is the point here

    def checked(argv):
        c = cfg(*argv)
        choice = compute.decide(c, CPU, None, torch.zeros(4, 3, 32, 32), torch.zeros(4, dtype=torch.long))
        c = compute.apply(c, choice)
        compute.check_device(c, CPU, choice)

    with pytest.raises(config.ConfigError) as caught:
        checked(flags)
    assert caught.value.fixes, str(caught.value)
    for fix in caught.value.fixes:
        checked([*flags, *fix])


def test_a_choice_is_timed_once_per_question_and_then_taken_from_the_cache(monkeypatch):
    """The same model, batch, threads and candidates on this processor: timed once, then read
    from the cache (the same setting, no timing); another batch is another question."""
    monkeypatch.setattr(compute, "cpu_has_native_bf16", lambda: False)
    calls = []

    def timed(model, images, labels, settings, device):
        calls.append(len(images))
        return {s: 1.0 + 0.1 * i for i, s in enumerate(reversed(settings))}  # the last is fastest

    monkeypatch.setattr(compute, "time_settings", timed)
    model, labels = build_model("smallcnn", 10), torch.zeros(8, dtype=torch.long)
    first = compute.decide(cfg(), CPU, model, torch.zeros(8, 3, 32, 32), labels)
    again = compute.decide(cfg(), CPU, model, torch.zeros(8, 3, 32, 32), labels)
    assert first["setting"] == again["setting"] == "fp32-channels-last" and calls == [8]
    assert "cached" in again["how"] and again["seconds_per_step"] == first["seconds_per_step"]
    compute.decide(cfg(), CPU, model, torch.zeros(16, 3, 32, 32), torch.zeros(16, dtype=torch.long))
    assert calls == [8, 16]
    with open(compute.cache_path()) as f:
        assert len(json.load(f)) == 2


def _cache_text(path) -> str:
    with open(path) as f:
        return f.read()


# (what is wrong, the entry for the question asked, what the warning says after "compute cache PATH: ")
BAD_ENTRIES = [
    ("a list", [1, 2], "the entry for this question is dropped: not a choice ({setting, seconds_per_step, timed_utc})"),
    ("an unknown setting", {"setting": "fp8", "seconds_per_step": {"fp32": 1.0, "fp32-channels-last": 2.0},
                            "timed_utc": "then"}, "the setting 'fp8' is not one of its candidates"),
    ("times not numbers", {"setting": "fp32", "seconds_per_step": {"fp32": "fast", "fp32-channels-last": 2.0},
                           "timed_utc": "then"}, "its seconds_per_step are not a number of seconds"),
    ("no time", {"setting": "fp32", "seconds_per_step": {"fp32": 1.0, "fp32-channels-last": 2.0}},
     "the entry for this question is dropped: not a choice"),
]


@pytest.mark.parametrize("what, entry, says", BAD_ENTRIES, ids=[c[0] for c in BAD_ENTRIES])
def test_a_bad_cache_entry_is_timed_again_with_one_warning_and_the_cache_rewritten_whole(
        monkeypatch, capsys, what, entry, says):
    """A cache that parses but holds an entry of another shape or an unknown setting for the
    question asked: dropped and timed again, one warning line, never an error; the cache is then
    whole again, with the good entries of other questions kept and the bad ones gone."""
    monkeypatch.setattr(compute, "cpu_has_native_bf16", lambda: False)
    calls = []
    monkeypatch.setattr(compute, "time_settings", lambda model, images, labels, settings, device: calls.append(1) or {
        s: 1.0 + 0.1 * i for i, s in enumerate(settings)})
    model, images, labels = build_model("smallcnn", 10), torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)
    key = compute.cache_key(cfg(), CPU, images, compute.candidates(cfg(), CPU))
    other_good = {"setting": "fp32", "seconds_per_step": {"fp32": 1.0, "fp32-channels-last": 1.5}, "timed_utc": "x"}
    path = compute.cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({key: entry, "another | fp32 fp32-channels-last": other_good, "a bad other | fp32": {"x": 1}}, f)
    choice = compute.decide(cfg(), CPU, model, images, labels)
    assert calls == [1] and choice["setting"] == "fp32" and "timed on this device" in choice["how"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"hvd_cifar: warning: compute cache {path}: ") and says in err[0], err
    assert err[0].endswith("; timing again")
    cache = json.loads(_cache_text(path))
    assert set(cache) == {key, "another | fp32 fp32-channels-last"} and cache[key]["setting"] == "fp32"
    assert compute.entry_problem(key, cache[key]) == ""
    again = compute.decide(cfg(), CPU, model, images, labels)  # now from the cache, without a word
    assert calls == [1] and "cached" in again["how"] and capsys.readouterr().err == ""


@pytest.mark.parametrize("text, says", [("{not json", "not a readable JSON file (JSONDecodeError)"),
                                        ("[1, 2]", "holds a JSON list, not an object of choices"),
                                        (b"\xff\xfe", "not a readable JSON file (UnicodeDecodeError)")])
def test_a_cache_file_that_is_not_a_json_object_is_timed_again_and_rewritten(monkeypatch, capsys, text, says):
    monkeypatch.setattr(compute, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(compute, "time_settings", lambda model, images, labels, settings, device: {
        s: 1.0 for s in settings})
    path = compute.cache_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())
    compute.decide(cfg(), CPU, build_model("smallcnn", 10), torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long))
    assert capsys.readouterr().err == f"hvd_cifar: warning: compute cache {path}: {says}; timing again\n"
    assert len(json.loads(_cache_text(path))) == 1


@pytest.mark.slow
def test_under_two_ranks_a_bad_cache_entry_is_one_warning_and_the_run_goes_on(tmp_path):
    """A real cache entry (a one-process run's) given an unknown setting: the 2-rank run that asks
    the same question times again, says so once, trains, and leaves the cache whole."""
    flags = ["--config", TINY, "--compute", "auto", "--epochs", "1", "--max-steps-per-epoch", "2",
             "--threads-per-rank", "1", "--log-dir", str(tmp_path)]
    run_train([*flags, "--run-name", "first"])
    path = compute.cache_path()
    cache = json.loads(_cache_text(path))
    [key] = cache
    cache[key]["setting"] = "fp8"
    with open(path, "w") as f:
        json.dump(cache, f)
    proc = run_train([*flags, "--run-name", "second"], launcher="mpirun", np=2)
    warnings = [line for line in proc.stderr.splitlines() if "compute cache" in line]
    assert warnings == [f"hvd_cifar: warning: compute cache {path}: the entry for this question is dropped: the "
                        f"setting 'fp8' is not one of its candidates ({', '.join(key.rsplit(' | ', 1)[-1].split())})"
                        f"; timing again"], proc.stderr[-3000:]
    fixed = json.loads(_cache_text(path))
    assert set(fixed) == {key} and compute.entry_problem(key, fixed[key]) == ""
