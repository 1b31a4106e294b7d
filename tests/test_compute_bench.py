"""benchmarks/compute.py's pairing: the plain setting fastest by its median is kept per round
under one name on every processor, so the docs' 0.97x target has a row wherever it runs."""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib

from hvd_cifar.measure.results import Results
from testbed import render_docs

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("compute_bench", ROOT / "benchmarks" / "compute.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_fastest_plain_setting_is_paired_under_one_name_and_named_in_the_file(tmp_path):
    args = argparse.Namespace(tag="t", results=str(tmp_path), repeats=3)
    r = Results("compute", args, bench.FIGURES, argv=[])
    settings = ["fp32", "fp32-channels-last"]
    for k, (nchw, cl, auto) in enumerate([(70.0, 80.0, 78.0), (72.0, 84.0, 83.0), (69.0, 79.0, 80.0)], start=1):
        r.add(k, "vgg11 plain fp32", {"images_per_s": nchw})
        r.add(k, "vgg11 plain fp32-channels-last", {"images_per_s": cl})
        r.add(k, f"vgg11 {bench.HVD}", {"images_per_s": auto})
    bench.derive(r, "vgg11", settings)
    with open(r.write()) as f:
        data = json.load(f)
    assert data["fastest_plain"] == {"vgg11": "fp32-channels-last"}
    fastest = {x["round"]: x["figures"]["images_per_s"] for x in data["rounds"] if x["config"] == "vgg11 plain fastest"}
    assert fastest == {1: 80.0, 2: 84.0, 3: 79.0}
    table = "\n".join(render_docs.paired_table(data, {"figure": "images_per_s", "ratio": "true", "target": "0.97",
                                                      "pair": [f"vgg11 {bench.HVD}|vgg11 plain fastest"]}))
    row = next(line for line in table.splitlines() if "plain fastest" in line)
    assert "not measured" not in row and ("in 3 pairs" in row or "| 3 |" in row)
    assert f"{(78 / 80 * 83 / 84 * 80 / 79) ** (1 / 3):.3f}" in row
