"""``compute: auto``: the precision and memory layout a run computes in, chosen for the device it
lands on by timing the run's own model at its own batch.

Which is fastest depends on the processor: bf16 autocast runs at native speed only where the CPU
has bf16 instructions (AVX-512 BF16, AMX), and is slower than fp32 where it is emulated; the
channels-last layout speeds convolutions up on some CPUs and slows them down on others; GPUs run
fp16 and bf16 on their tensor cores. So before training, rank 0 times a few training steps of a
copy of the model on one real batch in each setting the device runs well (``candidates``),
rotating their order from round to round, and takes the fastest; every rank gets the same answer
(``ranks.on_main``). The master weights, the optimizer state and the gradients that cross the
wire stay fp32 whatever is chosen: autocast changes the arithmetic of forward and backward only.

The choice and each candidate's seconds per step go into meta.json (``compute_choice``) and the
run's first line; resolved.yaml holds the setting chosen (``compute: bf16-channels-last``), so a
resumed run continues in it. Timing costs seconds (VGG-11) to tens of seconds (ResNet-18), so a
choice is kept in a cache file per (processor, torch, model, batch, image shape, threads,
candidates): later runs of the same question take it from there (``cache_path``; delete the file
to time again). A bad cache is only a cost: a file that is not a JSON object, or an entry of
another shape or naming a setting that is not among its question's candidates, is timed again
(one warning line from rank 0) and the cache rewritten whole without what was wrong.
"""
from __future__ import annotations

import copy
import datetime
import json
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from hvd_cifar.core import combinations
from hvd_cifar.core.config import COMPUTE_SETTINGS, Config, ConfigError, usable_cpus
from hvd_cifar.core.files import RunError, atomic_write

ROUNDS = 3            # rounds over the candidates, each in a rotated order
STEPS_PER_ROUND = 2   # timed training steps of a candidate per round (after one untimed warm-up step)
# Seconds the timed steps may take together, judged from the warm-ups: a large model on a slow
# processor times fewer steps (at least one per candidate), so that the other ranks, waiting for
# rank 0's answer, stay well inside Horovod's stall limits.
TIMED_BUDGET_S = 12.0
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic


def cpuinfo_field(name: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The first processor's ``name`` line of /proc/cpuinfo ("" when there is none)."""
    try:
        with open(cpuinfo) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(name)), "")
    except OSError:
        return ""


def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    flags = cpuinfo_field("flags", cpuinfo).split()
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def device_candidates(device: torch.device) -> list[str]:
    """The settings this device runs well: fp32 and bf16 (where native) on CPUs, each in both
    layouts; on GPUs fp16 (with a grad scaler), bf16 where supported, and fp32."""
    if device.type == "cuda":
        precisions = ["fp16", *(["bf16"] if torch.cuda.is_bf16_supported() else []), "fp32"]
    else:
        precisions = ["fp32", *(["bf16"] if cpu_has_native_bf16() else [])]
    return [f"{p}{layout}" for p in precisions for layout in ("", "-channels-last")]


def candidates(cfg: Config, device: torch.device) -> list[str]:
    """The settings ``compute: auto`` chooses among: the device's, less what the config rules
    out (fp16 where the sync method or the compression scheme cannot take a grad scaler: their
    registry entries say so), narrowed to a given amp (fp16 or bf16) and to channels_last: true."""
    allowed = device_candidates(device)
    if not combinations.takes_grad_scaler(cfg):
        allowed = [c for c in allowed if COMPUTE_SETTINGS[c][0] != "fp16"]
    if cfg.amp != "none":
        allowed = [c for c in allowed if COMPUTE_SETTINGS[c][0] == cfg.amp]
    if cfg.channels_last:
        allowed = [c for c in allowed if COMPUTE_SETTINGS[c][1]]
    return allowed


def check_device(cfg: Config, device: torch.device, choice: dict) -> None:
    """A precision the device cannot run is bad input, named by the key that asked for it:
    compute when it named the setting, else amp."""
    named = choice["how"] == "named in the config"
    key, layout = ("compute", "-channels-last" if cfg.channels_last else "") if named else ("amp", "")
    if cfg.amp == "fp16" and device.type != "cuda":
        raise ConfigError(f"{key}: fp16 autocast needs a GPU, and this run is on the CPU",
                          fixes=(["--compute", f"bf16{layout}"], ["--compute", "auto"]) if named
                          else (["--amp", "bf16"], ["--amp", "none"]))
    if cfg.amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"{key}: bf16 is not supported by {torch.cuda.get_device_name(device)}",
                          fixes=(["--compute", f"fp16{layout}"],) if named else (["--amp", "fp16"],))


def time_settings(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                  settings: list[str], device: torch.device) -> dict[str, float]:
    """Median seconds per training step (forward, backward, an SGD update) of a copy of
    ``model`` on the batch, in each setting: ROUNDS rounds in rotated order, STEPS_PER_ROUND
    steps each, after one warm-up step per setting (fewer when the warm-ups say that would
    take more than TIMED_BUDGET_S). The run's model, its RNG state and its BatchNorm statistics
    are left as they were."""
    seconds: dict[str, list[float]] = {s: [] for s in settings}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        copies = {s: copy.deepcopy(model).train() for s in settings}
        optimizers = {s: torch.optim.SGD(copies[s].parameters(), lr=1e-4, momentum=0.9) for s in settings}
        warm = sum(_step(copies[s], optimizers[s], images, labels, s, device)  # kernels picked, memory laid out
                   for s in settings)
        steps = max(1, min(ROUNDS * STEPS_PER_ROUND, int(TIMED_BUDGET_S / max(warm, 1e-9))))
        rounds = min(ROUNDS, steps)
        for k in range(rounds):
            for s in settings[k % len(settings):] + settings[:k % len(settings)]:
                for _ in range(max(1, steps // rounds)):
                    seconds[s].append(_step(copies[s], optimizers[s], images, labels, s, device))
    return {s: statistics.median(v) for s, v in seconds.items()}


def _step(model, optimizer, images, labels, setting: str, device: torch.device) -> float:
    amp, channels_last = COMPUTE_SETTINGS[setting]
    x = images.contiguous(memory_format=torch.channels_last) if channels_last else images
    scaler = torch.amp.GradScaler(device.type) if amp == "fp16" else None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.float16 if amp == "fp16" else torch.bfloat16, enabled=amp != "none"):
        loss = F.cross_entropy(model(x), labels)
    optimizer.zero_grad(set_to_none=True)
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def choose(timed: dict[str, float]) -> str:
    """The fastest setting; a tie (within 1 %) goes to the earlier one in the candidates' order
    (fp32 before bf16 on CPUs, NCHW before channels-last), so that noise does not switch a run
    away from the plainer setting for nothing."""
    best = min(timed.values())
    return next(s for s, t in timed.items() if t <= best * 1.01)


def decide(cfg: Config, device: torch.device, model: torch.nn.Module, images: torch.Tensor,
           labels: torch.Tensor, elastic: bool = False) -> dict:
    """What this run computes in: {"setting", "how", "seconds_per_step"} (the last only when
    candidates were timed). Run by rank 0; the caller hands the answer to every rank."""
    given = next(s for s, v in COMPUTE_SETTINGS.items() if v == (cfg.amp, cfg.channels_last))
    if cfg.compute == "fixed":
        return {"setting": given, "how": "fixed (amp and channels_last as given)"}
    if cfg.compute != "auto":
        return {"setting": cfg.compute, "how": "named in the config"}
    allowed = candidates(cfg, device)
    if not allowed:
        return {"setting": given, "how": "auto: the amp and channels_last given leave no candidate this device runs well"}
    if len(allowed) == 1 or elastic:
        how = "auto: the only candidate" if len(allowed) == 1 else "auto: not timed under elastic training (first candidate)"
        return {"setting": allowed[0], "how": how}
    key = cache_key(cfg, device, images, allowed)
    cache, problem = read_cache(key)
    if problem:  # rank 0 alone decides, so this is said once
        print(f"hvd_cifar: warning: compute cache {cache_path()}: {problem}; timing again", file=sys.stderr, flush=True)
    if cached := cache.get(key):
        return {"setting": cached["setting"], "how": f"auto: fastest of {len(allowed)} as timed on this processor "
                f"at {cached['timed_utc']} (cached: {cache_path()})", "seconds_per_step": cached["seconds_per_step"],
                "timing_s": 0.0}
    began = time.perf_counter()
    timed = time_settings(model, images, labels, allowed, device)
    choice = {"setting": choose(timed), "how": f"auto: fastest of {len(allowed)} timed on this device",
              "seconds_per_step": {s: round(t, 6) for s, t in timed.items()},
              "timing_s": round(time.perf_counter() - began, 3)}
    write_cache(key, {"setting": choice["setting"], "seconds_per_step": choice["seconds_per_step"],
                      "timed_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")})
    return choice


def cache_path() -> str:
    """The cache file: $HVD_CIFAR_CACHE_DIR, else $XDG_CACHE_HOME/hvd_cifar, else ~/.cache/hvd_cifar."""
    folder = os.environ.get("HVD_CIFAR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hvd_cifar")
    return os.path.join(folder, "compute-choices.json")


def processor(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpuinfo_field("model name") or "cpu"


def cache_key(cfg: Config, device: torch.device, images: torch.Tensor, candidates: list[str]) -> str:
    """What a choice depends on: the processor, torch, the model, the batch, its image shape,
    the threads and the candidates."""
    return (f"{processor(device)} | torch {torch.__version__} | {cfg.model}{'' if cfg.batchnorm else ' no-bn'} | "
            f"batch {len(images)} of {'x'.join(map(str, images.shape[1:]))} | threads {torch.get_num_threads()} | "
            f"{' '.join(candidates)}")


def entry_problem(key: str, entry) -> str:
    """What is wrong with one cached choice ('' when nothing): it must have the shape write_cache
    gives it, its setting one of its question's candidates (the key's last part) and its
    seconds per step a number for each of them."""
    candidates = key.rsplit(" | ", 1)[-1].split()
    if not (isinstance(entry, dict) and isinstance(entry.get("timed_utc"), str)
            and isinstance(entry.get("seconds_per_step"), dict)):
        return "not a choice ({setting, seconds_per_step, timed_utc})"
    if entry.get("setting") not in COMPUTE_SETTINGS or entry["setting"] not in candidates:
        return f"the setting {str(entry.get('setting'))[:40]!r} is not one of its candidates ({', '.join(candidates)})"
    times = entry["seconds_per_step"]
    if sorted(times) != sorted(candidates) or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0
            for t in times.values()):
        return "its seconds_per_step are not a number of seconds for each candidate"
    return ""


def read_cache(key: str | None = None) -> tuple[dict, str]:
    """(the cache's good entries, what was wrong): a missing file is an empty cache; a file that
    is not a JSON object, or the entry for ``key`` if it is bad, is said in the second part;
    every bad entry is left out (write_cache then writes the cache without them)."""
    try:
        with open(cache_path(), "rb") as f:
            cache = json.loads(f.read().decode())
    except FileNotFoundError:
        return {}, ""
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        return {}, f"not a readable JSON file ({type(exc).__name__})"
    if not isinstance(cache, dict):
        return {}, f"holds a JSON {type(cache).__name__}, not an object of choices"
    problems = {k: why for k, v in cache.items() if (why := entry_problem(k, v))}
    good = {k: v for k, v in cache.items() if k not in problems}
    return good, (f"the entry for this question is dropped: {problems[key]}" if key in problems else "")


def write_cache(key: str, entry: dict) -> None:
    """Add one choice, written whole (core.files.atomic_write: a temp file renamed into place);
    a cache that cannot be written is only a cost, never an error."""
    path = cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cache = {**read_cache()[0], key: entry}  # read again: another run may have added one since
        atomic_write(path, lambda f: f.write(json.dumps(cache, indent=1).encode()))
    except (OSError, RunError):
        pass


def described(choice: dict) -> str:
    """The choice as the run's first line says it: how, and each candidate's time per step."""
    times = choice.get("seconds_per_step")
    return choice["how"] + (": " + ", ".join(f"{s} {1000 * t:.0f} ms" for s, t in times.items()) + " per step"
                            if times else "")


def apply(cfg: Config, choice: dict) -> Config:
    """The copy of ``cfg`` the run uses: the chosen setting, and the amp and channels_last it
    names, settled (resolved.yaml records them; config.yaml keeps what was given)."""
    setting = choice["setting"]
    amp, channels_last = COMPUTE_SETTINGS[setting]
    return cfg.settle(choice["how"], compute=setting).settle(f"from compute: {setting}", amp=amp,
                                                            channels_last=channels_last)


def threads_for_rank(cfg: Config, sync) -> int:
    """Intra-op threads for this rank: threads_per_rank when given, else the CPUs this process
    may run on shared among the ranks on this host that may run on them too. A launcher that
    binds each rank to its own cores (mpirun --bind-to core, Slurm's --cpus-per-task) gives it
    those; ranks left unbound share the host's. Elastic training may not wait on other ranks
    before its loop, so there the host's CPUs are shared by its local ranks."""
    if cfg.threads_per_rank:
        return cfg.threads_per_rank
    mine = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(usable_cpus()))
    if sync.elastic or sync.size == 1:
        return max(1, len(mine) // (1 if sync.size == 1 else sync.local_size))
    host = socket.gethostname()
    sharing = sum(1 for h, cpus in sync.allgather_object((host, sorted(mine))) if h == host and mine & set(cpus))
    return max(1, len(mine) // sharing)
