"""hvd_cifar.analysis.crossover and ``predict --accuracy-from``: the time to an accuracy target on a
link, worked by hand; the rate below which a scheme gets there sooner, against the one-step break
even where the epochs are the same and lower where the scheme needs more; the scheme's warm-ups;
and the command on run folders written here (tests/runfolders.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import md_table
from hvd_cifar import predict, report
from hvd_cifar.analysis import crossover as x
from hvd_cifar.analysis import scaling as p
from hvd_cifar.core import cost
from runfolders import epoch_record, evaluation, write_run

COMPUTE = p.Compute(model="smallcnn", num_classes=10, sync="horovod", world_size=2, compression="none",
                    accumulation_steps=1, frozen_blocks=0, images_per_step=32, data_s=0.001, forward_s=0.01,
                    backward_s=0.02, other_s=0.0, optimizer_s=0.002, sync_s=0.0, hidden_fraction=0.0, step_s=0.033,
                    threads_per_rank=1)
PROF = p.profile("smallcnn", 10)
NET = p.Network({"horovod": p.Link(1e-4, 1.25e7)}, None)  # 100 Mbit/s
PLAIN = p.Scenario("horovod", "none", 1, 0)
FP16 = replace(PLAIN, compression="fp16")


def step(s, net=NET):
    return p.predict_step(COMPUTE, PROF, net, s, 2)["step_s"]


SLOW = x.at_bandwidth(NET, "horovod", 2.5e6)  # 20 Mbit/s


def curve(epochs, steps=10, s=PLAIN, eval_s=0.5, other_s=2.0):
    """A run measured on NET whose epochs took what the model says ``s``'s steps take there."""
    n = epochs or 6
    return x.Curve(epochs, steps, (steps * step(s),) * n, (eval_s,) * n, other_s)


def test_on_its_own_link_a_run_takes_its_measured_time_and_elsewhere_what_the_link_changes():
    run = replace(curve(3), epoch_s=(4.0, 3.0, 3.5))
    here = x.time_to_target(COMPUTE, PROF, NET, NET, [PLAIN] * 3, PLAIN, 2, run)
    assert here == pytest.approx(2.0 + 4.0 + 3.0 + 3.5 + 3 * 0.5)  # start-up, epochs, evaluations
    there = x.time_to_target(COMPUTE, PROF, SLOW, NET, [PLAIN] * 3, PLAIN, 2, run)
    assert there == pytest.approx(here + 3 * 10 * (step(PLAIN, SLOW) - step(PLAIN)))
    assert x.time_to_target(COMPUTE, PROF, SLOW, NET, [PLAIN] * 3, PLAIN, 2, replace(run, epochs=None)) is None


def test_a_schemes_warmup_updates_are_priced_as_the_whole_gradient():
    # 15 warm-up updates of 10 per epoch: all of the first epoch, half of the second
    run = curve(3, s=FP16, eval_s=0.0, other_s=0.0)
    got = x.time_to_target(COMPUTE, PROF, SLOW, NET, [FP16] * 3, PLAIN, 2, run, warmup_steps=15)
    change = 15 * (step(PLAIN, SLOW) - step(PLAIN)) + 15 * (step(FP16, SLOW) - step(FP16))
    assert got == pytest.approx(sum(run.epoch_s) + change)


def test_topk_sends_each_epochs_share_of_its_sparsity_warmup():
    topk = replace(PLAIN, compression="topk", settings=(("topk_fraction", 0.004), ("topk_min_entries", 4096),
                                                          ("topk_warmup_epochs", 4.0)))
    shares = [dict(s.settings)["topk_fraction"] for s in x.epoch_scenarios(topk, 6)]
    assert shares == [pytest.approx(cost.topk_fraction_at(e, 0.004, 4.0)) for e in range(6)]
    assert shares[0] > shares[3] > shares[4] == shares[5] == 0.004
    assert x.epoch_scenario(PLAIN, 2) is PLAIN


def test_with_the_same_epochs_the_crossover_is_the_steps_break_even_and_more_epochs_lower_it():
    fp16 = replace(FP16, scheme_s=0.004)  # its casts: it pays them on a fast link
    below = x.sooner_below(COMPUTE, PROF, NET, PLAIN, curve(4), [fp16] * 4, curve(4, s=fp16), 2)
    assert below == pytest.approx(p.break_even_bandwidth(COMPUTE, PROF, NET, PLAIN, fp16, 2), rel=1e-3)
    slow, fast = x.at_bandwidth(NET, "horovod", below * 0.9), x.at_bandwidth(NET, "horovod", below * 1.1)
    assert step(fp16, slow) < step(PLAIN, slow) and step(fp16, fast) > step(PLAIN, fast)
    more = x.sooner_below(COMPUTE, PROF, NET, PLAIN, curve(4), [fp16] * 5, curve(5, s=fp16), 2)
    assert 0 < more < below
    # without its casts fp16 only halves the bytes: sooner at every rate searched
    assert x.sooner_below(COMPUTE, PROF, NET, PLAIN, curve(4), [FP16] * 4, curve(4, s=FP16), 2) == x.HIGHEST


def test_a_run_that_never_reaches_the_target_is_sooner_at_no_rate():
    reached, never = curve(4), curve(None)
    assert x.sooner_below(COMPUTE, PROF, NET, PLAIN, reached, [FP16] * 4, never, 2) == 0.0
    assert x.sooner_below(COMPUTE, PROF, NET, PLAIN, never, [FP16] * 4, reached, 2) is None
    assert x.rate_words(0.0) == "no rate" and x.rate_words(8 * x.HIGHEST) == "every rate"
    assert x.rate_words(2.5e7) == "25 Mbit/s" and x.rate_words(None) == "-"


def accuracy_run(folder, compression: str, epochs_to_target: int | None, epoch_time_s: float = 0.9, **config):
    """A 2-rank run of 6 epochs of 20 steps (``epoch_time_s`` each) that reached 0.9 at ``epochs_to_target``."""
    records = [epoch_record(e, 2, steps=20, epoch_time_s=epoch_time_s, elapsed_s=1.0 + (e + 1) * (epoch_time_s + 0.12))
               for e in range(6)]
    target = {"target_acc": config.get("target_acc", 0.9), "epochs_to_target": epochs_to_target,
              "time_to_target_s": None if epochs_to_target is None else 2.5 + 1.1 * epochs_to_target}
    path = write_run(folder, records, config={"compression": compression, "target_acc": 0.9, "epochs": 6,
                                              "threads_per_rank": 1, **config}, eval_json=False)
    (path / "eval.json").write_text(__import__("json").dumps(evaluation(records[-1], target)))
    return path


def test_predict_names_each_schemes_crossover_from_the_runs_epochs_to_the_target(tmp_path, capsys):
    compute = write_run(tmp_path / "np1", config={"threads_per_rank": 1})
    none = accuracy_run(tmp_path / "none", "none", 4)
    # PowerSGD's epochs a tenth of a second longer on the runs' 100mbit link: sooner only below some slower rate
    psgd = accuracy_run(tmp_path / "psgd", "powersgd", 4, epoch_time_s=1.0, compression_warmup_steps=20)
    never = accuracy_run(tmp_path / "fp16", "fp16", None)
    out = tmp_path / "out"
    argv = [str(compute), "--bandwidth", "100mbit", "--np", "2", "--out", str(out), "--at-rates", "20mbit",
            "--accuracy-from", str(none), str(psgd), str(never)]
    assert predict.main(argv) == 0
    text = capsys.readouterr().out
    rows = {r["compression"]: r for r in md_table(text.split("time to target_acc 0.9 at np=2")[1], "")}
    assert rows["fp16"]["sooner than uncompressed below"] == "no rate" and rows["fp16"]["epochs to target"] == "-"
    assert rows["none"]["sooner than uncompressed below"] == "-"
    assert rows["powersgd r=4"]["epochs to target"] == "4"
    assert rows["powersgd r=4"]["sooner than uncompressed below"].endswith("Mbit/s")
    assert float(rows["powersgd r=4"]["sooner than uncompressed below"].split()[0]) < 100
    # on their own link the runs take their own time to the target (1 s to start, 4 epochs and evaluations)
    assert rows["none"]["time to target at their link (s)"] == "5.1"
    assert rows["powersgd r=4"]["time to target at their link (s)"] == "5.5"
    assert float(rows["none"]["time to target at 20mbit (s)"]) > 6.6 and rows["fp16"]["time to target at 20mbit (s)"] == "-"
    assert (out / "crossover.csv").read_text().count("\n") == 4
    assert predict.main(argv[:7] + ["--at-rates", "fast"] + argv[9:]) == 2
    assert "--at-rates:" in capsys.readouterr().err
    # the runs must be comparable: one uncompressed run, one target, one world size
    assert predict.main(argv[:-3] + [str(psgd), str(never)]) == 2
    assert "needs exactly one run with compression none" in capsys.readouterr().err
    other = accuracy_run(tmp_path / "other", "topk", 3, target_acc=0.8)
    assert predict.main(argv + [str(other)]) == 2
    assert "must share one target_acc" in capsys.readouterr().err


def test_the_comparison_report_says_where_each_compression_reaches_the_target_sooner(tmp_path):
    none = accuracy_run(tmp_path / "none", "none", 4)
    psgd = accuracy_run(tmp_path / "psgd", "powersgd", 4, epoch_time_s=1.0, compression_warmup_steps=20)
    other = accuracy_run(tmp_path / "other", "none", 3, target_acc=0.8)  # another target: a set of its own, alone
    assert report.main([str(none), str(psgd), str(other), "--out", str(tmp_path / "cmp")]) == 0
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert text.count("## Time to the target") == 1 and text.count("### smallcnn on digits, np=2") == 1
    rows = {r["compression"]: r for r in md_table(text, "### smallcnn on digits, np=2")}
    assert set(rows) == {"none", "powersgd r=4"}
    assert rows["none"]["time to target (s)"] == "5.1" and rows["powersgd r=4"]["time to target (s)"] == "5.5"
    assert rows["powersgd r=4"]["sooner than uncompressed below"].endswith("Mbit/s")
    # without an uncompressed run of the same target there is nothing to compare with
    assert report.main([str(psgd), str(other), "--out", str(tmp_path / "cmp2")]) == 0
    assert "## Time to the target" not in (tmp_path / "cmp2" / "compare.md").read_text()


def test_accuracy_runs_unlike_the_compute_run_or_shorter_than_their_target_are_one_line(tmp_path, capsys):
    compute = write_run(tmp_path / "np1", config={"threads_per_rank": 1})
    none = accuracy_run(tmp_path / "none", "none", 4)
    base = [str(compute), "--bandwidth", "100mbit", "--np", "2", "--out", str(tmp_path / "out"), "--accuracy-from",
            str(none)]
    accumulating = accuracy_run(tmp_path / "acc", "powersgd", 4, accumulation_steps=4)
    assert predict.main(base + [str(accumulating)]) == 2
    assert "acc has accumulation_steps 4, the compute run 1" in capsys.readouterr().err
    frozen = accuracy_run(tmp_path / "frozen", "fp16", 4, freeze=2)
    assert predict.main(base + [str(frozen)]) == 2
    assert "runs that freeze blocks are not priced" in capsys.readouterr().err
    short = accuracy_run(tmp_path / "short", "fp16", 4)
    lines = (short / "metrics.jsonl").read_text().splitlines()
    (short / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")  # eval.json says epoch 4, two records
    assert predict.main(base + [str(short)]) == 2
    err = capsys.readouterr().err
    assert "reached its target at epoch 4 but metrics.jsonl holds 2 whole epoch record(s)" in err and "\n" == err[-1] and err.count("\n") == 1
