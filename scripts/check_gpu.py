"""hvd_cifar's GPU path, checked end to end on one machine with one NVIDIA GPU, into one JSON file.

    scripts/check-gpu.sh                       # on the GPU machine: builds Horovod, then runs this
    python scripts/check_gpu.py --out results.json             # the runs alone (Horovod installed)
    python scripts/check_gpu.py --out results.json --dry-run   # the same runs on the CPU, tiny sizes
    python scripts/check_gpu.py plain --model vgg11 --amp bf16 ...  # the plain PyTorch loop alone

What it runs, each through ``python -m hvd_cifar.train`` as a user would (one process: np = 1):
  * throughput: VGG-11 and ResNet-18 on synthetic 32x32 images at batch 256 (no augmentation), with
    fp32, AMP fp16 (with the grad scaler), AMP bf16 and channels-last, under ``sync: horovod`` and
    ``ddp``; each beside a plain PyTorch loop with the same model, batch, optimizer, gradient
    clipping, autocast and memory layout on the same card (``plain`` below). Figure: the mean
    images/s of the epochs after the first, and its ratio to the plain loop's (target >= 0.95).
  * accuracy: digits at the defaults (VGG-11, 6 epochs), target test accuracy 0.95.
  * 2 ranks sharing the one GPU under ``horovodrun --gloo``: whether it runs, and if it does,
    whether both ranks end with identical parameters.
Every figure goes into the one results file: the device, driver, torch and CUDA versions, each
run's command, exit status, figures and, for a run that failed, its last error line.
--dry-run runs every case on the CPU at tiny sizes, so that this script's own logic (commands,
run folders, the plain loop, the comparison, the file) is checked on a machine without a GPU;
its figures say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TARGET_SPEED_RATIO = 0.95  # hvd_cifar's images/s over the plain loop's, same settings, same card
TARGET_ACCURACY = 0.95     # digits at the defaults

# The throughput cases: (name, model, amp, channels_last, sync). The plain loop runs once per
# distinct (model, amp, channels_last); the ddp case shares the fp32 one's.
CASES = (
    ("vgg11-fp32-horovod", "vgg11", "none", False, "horovod"),
    ("vgg11-fp32-ddp", "vgg11", "none", False, "ddp"),
    ("vgg11-fp16-horovod", "vgg11", "fp16", False, "horovod"),
    ("vgg11-bf16-horovod", "vgg11", "bf16", False, "horovod"),
    ("vgg11-bf16-channels-last-horovod", "vgg11", "bf16", True, "horovod"),
    ("resnet18-fp32-horovod", "resnet18", "none", False, "horovod"),
    ("resnet18-bf16-channels-last-horovod", "resnet18", "bf16", True, "horovod"),
)
# Sizes: (batch, steps per epoch, epochs) for the GPU and for --dry-run. The dry run trains the
# small CNN in every case: VGG-11 in fp16 on a CPU took over 300 s for 6 steps of 16 images.
SIZES = {"gpu": (256, 40, 3), "dry": (8, 2, 2)}
DRY_RUN_MODEL = "smallcnn"


# ----------------------------------------------------------------------------- the plain loop
def plain_loop(model_name: str, amp: str, channels_last: bool, batch: int, steps: int, epochs: int,
               lr: float, seed: int = 0) -> dict:
    """A plain PyTorch training loop with hvd_cifar.train's settings at np = 1 and
    ``--augment false``: the same model and initialisation, inputs held on the device as uint8 and
    normalised per batch, SGD (momentum 0.9, Nesterov, weight decay 5e-4), gradients clipped to a
    global norm of 1, autocast (fp16 with a grad scaler) and NHWC inputs as asked. Images/s: the
    mean over the epochs after the first, timed between CUDA synchronisations."""
    import torch
    import torch.nn.functional as F
    try:
        from hvd_cifar.workload.models import build_model
    except ImportError:  # the package's layout before its modules moved into folders
        from hvd_cifar.models import build_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    model = build_model(model_name, 10).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch * steps, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)
    labels = torch.randint(0, 10, (batch * steps,), generator=g).to(device)
    mean = torch.tensor([0.5, 0.5, 0.5], device=device).view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.25, 0.25], device=device).view(1, 3, 1, 1)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    model.train()
    per_epoch = []
    for _ in range(epochs):
        sync()
        start = time.perf_counter()
        for step in range(steps):
            x = images[step * batch:(step + 1) * batch].float().div_(255).sub_(mean).div_(std)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = labels[step * batch:(step + 1) * batch]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = F.cross_entropy(model(x), y)
            if scaler:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
        sync()
        per_epoch.append(batch * steps / (time.perf_counter() - start))
    after_first = per_epoch[1:] or per_epoch
    return {"images_per_s": sum(after_first) / len(after_first), "images_per_s_per_epoch": per_epoch,
            "device": str(device), "final_loss": loss.item()}


# ----------------------------------------------------------------------------- hvd_cifar's runs
def last_error_line(text: str) -> str:
    """The line that says what went wrong: hvd_cifar's own one-line verdict if there is one,
    else the last line that mentions an error, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "hvd_cifar: error" in line or "hvd_cifar: rank" in line:
            return line
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line
    return lines[-1] if lines else ""


def run(cmd: list[str], timeout: float) -> tuple[dict, str]:
    """Runs ``cmd`` in the repository's root: its exit status (None when stopped at ``timeout``),
    wall time and, on failure, its error line; and its standard output."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, stdout, stderr = {"returncode": proc.returncode}, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        out = {"returncode": None, "timed_out_after_s": timeout}
        stdout, stderr = (exc.stdout or b"").decode(errors="replace"), (exc.stderr or b"").decode(errors="replace")
    out["command"] = shlex.join(cmd)
    out["wall_s"] = round(time.monotonic() - start, 1)
    if out["returncode"] != 0:
        out["error"] = last_error_line(stdout + stderr) or f"no output; stopped after {timeout} s"
    return out, stdout


def read_run(run_dir: Path) -> dict:
    """The figures of a finished run folder: images/s (mean over the epochs after the first, as
    hvd_cifar.report takes them), the last epoch's test accuracy, eval.json's verdicts."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    after_first = lines[1:] or lines
    figures = {"epochs": len(lines),
               "images_per_s": sum(m["images_per_s"] for m in after_first) / len(after_first),
               "images_per_s_per_epoch": [m["images_per_s"] for m in lines],
               "test_acc": lines[-1]["test_acc"], "world_size": lines[-1].get("world_size")}
    peaks = lines[-1].get("gpu_mem_peak_bytes")
    if peaks is not None:
        figures["gpu_mem_peak_bytes"] = peaks
    evaluation = run_dir / "eval.json"
    if evaluation.exists():
        verdicts = json.loads(evaluation.read_text())
        figures["final_test_acc"] = verdicts.get("test_acc")
        figures["parameters_identical_across_ranks"] = verdicts.get("parameters_identical_across_ranks")
    return figures


def train(logs: Path, name: str, flags: list[str], launcher: list[str], timeout: float) -> dict:
    cmd = [*launcher, PY, "-m", "hvd_cifar.train", *flags, "--log-dir", str(logs), "--run-name", name,
           "--progress", "false", "--tensorboard", "false"]
    result, _ = run(cmd, timeout)
    if result["returncode"] == 0:
        result.update(read_run(logs / name))
    return result


def plain(model: str, amp: str, channels_last: bool, batch: int, steps: int, epochs: int, timeout: float) -> dict:
    """The plain loop in a process of its own, as hvd_cifar.train runs in one."""
    cmd = [PY, str(Path(__file__).resolve()), "plain", "--model", model, "--amp", amp, "--batch-size", str(batch),
           "--steps", str(steps), "--epochs", str(epochs), *(["--channels-last"] if channels_last else [])]
    result, stdout = run(cmd, timeout)
    if result["returncode"] == 0:
        result.update(json.loads(stdout.strip().splitlines()[-1]))
    return result


def environment() -> dict:
    import torch
    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cuda_available": torch.cuda.is_available()}
    try:
        import horovod
        import horovod.torch as hvd
        info["horovod"] = horovod.__version__
        info["horovod_built"] = {"nccl": hvd.nccl_built(), "cuda": hvd.cuda_built(), "gloo": hvd.gloo_built(),
                                 "mpi": hvd.mpi_built()}
    except Exception as exc:  # noqa: BLE001 - recorded: the runs below then fail and say why
        info["horovod_error"] = f"{type(exc).__name__}: {exc}"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                    device_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                    compute_capability=f"{props.major}.{props.minor}")
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        info["driver"] = smi.stdout.strip() if smi.returncode == 0 else None
    else:
        info.update(device="cpu", driver=None)
    return info


def check(out: Path, dry_run: bool, only: list[str] | None, build: dict) -> dict:
    batch, steps, epochs = SIZES["dry" if dry_run else "gpu"]
    timeout = 300 if dry_run else 240
    results: dict = {"check": "hvd_cifar GPU path", "dry_run": dry_run,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "environment": environment(), "build": build,
                     "targets": {"speed_ratio_vs_plain": TARGET_SPEED_RATIO, "digits_test_acc": TARGET_ACCURACY},
                     "sizes": {"batch_size": batch, "steps_per_epoch": steps, "epochs": epochs,
                               "images": "synthetic 32x32, no augmentation",
                               **({"every_model": DRY_RUN_MODEL} if dry_run else {})},
                     "throughput": {}}

    def save():  # after every run, so that a check stopped half-way still leaves its figures
        out.write_text(json.dumps(results, indent=2) + "\n")

    save()
    with tempfile.TemporaryDirectory(prefix="check-gpu-") as tmp:
        logs = Path(tmp)
        plains: dict = {}
        for name, model, amp, channels_last, sync in CASES:
            if only and name not in only:
                continue
            if dry_run:
                model = DRY_RUN_MODEL
            key = (model, amp, channels_last)
            if key not in plains:
                plains[key] = plain(model, amp, channels_last, batch, steps, epochs, timeout)
            ours = train(logs, name, ["--dataset", "synthetic", "--synthetic-size", str(batch * steps),
                                      "--augment", "false", "--model", model, "--batch-size", str(batch),
                                      "--epochs", str(epochs), "--amp", amp, "--channels-last", str(channels_last).lower(),
                                      "--sync", sync, "--checkpoint-every", "0"], [], timeout)
            case = {"model": model, "amp": amp, "channels_last": channels_last, "sync": sync, "np": 1,
                    "hvd_cifar": ours, "plain_pytorch": plains[key]}
            if "images_per_s" in ours and "images_per_s" in plains[key]:
                case["speed_ratio_vs_plain"] = ours["images_per_s"] / plains[key]["images_per_s"]
                case["meets_target"] = case["speed_ratio_vs_plain"] >= TARGET_SPEED_RATIO
            results["throughput"][name] = case
            save()

        if not only or "digits" in only:
            # The defaults (VGG-11, batch 32, its lr) for 6 epochs; the dry run, 1 short epoch.
            flags = ["--dataset", "digits", "--epochs", "6", "--target-acc", str(TARGET_ACCURACY)]
            if dry_run:
                flags = ["--config", "configs/tiny.yaml", "--epochs", "1"]
            digits = train(logs, "digits", flags, [], timeout)
            digits["meets_target"] = digits.get("final_test_acc", 0) >= TARGET_ACCURACY
            results["digits"] = digits
            save()

        if not only or "two-ranks" in only:
            # Two ranks, one GPU: Horovod's Gloo launcher, no MPI. Whatever happens is the figure.
            horovodrun = [str(Path(PY).with_name("horovodrun"))]
            if not Path(horovodrun[0]).exists():
                horovodrun = ["horovodrun"]
            two = train(logs, "two-ranks", ["--config", "configs/tiny.yaml", "--epochs", "2"],
                        [*horovodrun, "--gloo", "-np", "2", "-H", "localhost:2"], timeout)
            results["two_ranks_one_gpu"] = two
            save()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    return results


def summary_lines(results: dict) -> list[str]:
    """One line per figure, for the log; the file holds everything."""
    env = results["environment"]
    lines = [f"device {env.get('device')}, driver {env.get('driver')}, torch {env.get('torch')}, "
             f"CUDA {env.get('torch_cuda')}, horovod {env.get('horovod', env.get('horovod_error'))}"]
    for name, case in results["throughput"].items():
        ours, base = case["hvd_cifar"], case["plain_pytorch"]
        if "speed_ratio_vs_plain" in case:
            lines.append(f"{name}: {ours['images_per_s']:.0f} img/s, plain loop {base['images_per_s']:.0f} img/s, "
                         f"ratio {case['speed_ratio_vs_plain']:.3f}")
        else:
            lines.append(f"{name}: FAILED: {ours.get('error') or base.get('error')}")
    if "digits" in results:
        d = results["digits"]
        lines.append(f"digits: test accuracy {d['final_test_acc']:.4f} in {d['epochs']} epochs" if "final_test_acc" in d
                     else f"digits: FAILED: {d.get('error')}")
    if "two_ranks_one_gpu" in results:
        t = results["two_ranks_one_gpu"]
        lines.append(f"2 ranks, one GPU (horovodrun --gloo): world size {t.get('world_size')}, parameters identical "
                     f"{t.get('parameters_identical_across_ranks')}" if t["returncode"] == 0
                     else f"2 ranks, one GPU (horovodrun --gloo): FAILED: {t.get('error')}")
    return lines


def main() -> int:
    if sys.argv[1:2] == ["plain"]:
        p = argparse.ArgumentParser(prog="check_gpu.py plain", description=plain_loop.__doc__.splitlines()[0])
        p.add_argument("--model", default="vgg11")
        p.add_argument("--amp", choices=("none", "fp16", "bf16"), default="none")
        p.add_argument("--channels-last", action="store_true")
        p.add_argument("--batch-size", type=int, default=256)
        p.add_argument("--steps", type=int, default=40)
        p.add_argument("--epochs", type=int, default=3)
        p.add_argument("--lr", type=float, default=0.02)
        a = p.parse_args(sys.argv[2:])
        print(json.dumps(plain_loop(a.model, a.amp, a.channels_last, a.batch_size, a.steps, a.epochs, a.lr)))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the results file (JSON)")
    p.add_argument("--dry-run", action="store_true", help="on the CPU, tiny sizes: checks this script, not a GPU")
    p.add_argument("--note", action="append", default=[], metavar="KEY=VALUE",
                   help="a figure measured before this script ran (check-gpu.sh: the Horovod build's), kept under 'build'")
    p.add_argument("--only", nargs="+", metavar="CASE",
                   help=f"run only these: {', '.join(c[0] for c in CASES)}, digits, two-ranks")
    a = p.parse_args()
    import torch
    if not a.dry_run and not torch.cuda.is_available():
        print(f"check_gpu.py: no CUDA GPU: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none; "
              f"this check needs one (--dry-run runs its CPU parts)", file=sys.stderr)
        return 1
    # hvd_cifar from this tree, installed or not (the plain loop's process starts in scripts/)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    results = check(a.out, a.dry_run, a.only, dict(note.split("=", 1) for note in a.note))
    for line in summary_lines(results):
        print(line, flush=True)
    print(f"results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
