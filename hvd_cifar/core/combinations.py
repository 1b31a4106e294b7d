"""The config's rules that tie keys together: what each combination of settings can honour,
and what to give instead when it cannot (``ConfigError.fixes``; ``Config.validate`` calls them
after each key was checked on its own), and which keys a combination leaves without effect
(``inert_keys``: a warning, not a refusal)."""
from __future__ import annotations

from hvd_cifar.compress import registry
from hvd_cifar.core.errors import ConfigError
from hvd_cifar.core.names import SCHEME_SYNC_METHODS, runs_a_scheme


def validate_horovod_tuning(cfg) -> None:
    """Horovod's tuning keys, each in its range (under another sync method they do nothing:
    ``inert_keys`` says so)."""
    if cfg.horovod_cycle_time_ms is not None and not cfg.horovod_cycle_time_ms > 0:
        raise ConfigError(f"horovod_cycle_time_ms: must be > 0 (milliseconds), got {cfg.horovod_cycle_time_ms}")
    if cfg.horovod_fusion_threshold_mb is not None and cfg.horovod_fusion_threshold_mb < 0:
        raise ConfigError(f"horovod_fusion_threshold_mb: must be >= 0 (MiB; 0 = no fusion), "
                          f"got {cfg.horovod_fusion_threshold_mb}")


def validate_compute(cfg, settings: dict[str, tuple[str, bool]]) -> None:
    """compute naming one setting sets amp and channels_last from it; a different amp or
    channels_last given with it is a contradiction (auto and fixed leave them as they are)."""
    if cfg.compute not in settings:
        return
    amp, channels_last = settings[cfg.compute]
    if cfg.amp not in ("none", amp):
        raise ConfigError(f"amp: {cfg.amp} contradicts compute: {cfg.compute}",
                          fixes=(["--amp", amp], ["--compute", "fixed"]))
    if cfg.channels_last and not channels_last:
        raise ConfigError(f"channels_last: true contradicts compute: {cfg.compute}",
                          fixes=(["--no-channels-last"], ["--compute", f"{cfg.compute}-channels-last"]))
    cfg.amp, cfg.channels_last = amp, channels_last


def validate_freeze(cfg) -> None:
    """freeze, freeze_auto_threshold and freeze_schedule: in range, and not with what they cannot
    honour (elastic, mpi-async-ps's unaveraged gradients)."""
    if isinstance(cfg.freeze, str) and cfg.freeze != "auto":
        raise ConfigError(f"freeze: expected a number of leading blocks or auto, got {cfg.freeze!r}")
    if cfg.freeze != "auto" and cfg.freeze < 0:
        raise ConfigError(f"freeze: must be >= 0, got {cfg.freeze}")
    if not cfg.freeze_auto_threshold > 0:
        raise ConfigError(f"freeze_auto_threshold: must be > 0, got {cfg.freeze_auto_threshold} "
                          f"(a block freezes when its change is below it; no freezing is freeze: 0)")
    if cfg.elastic and (cfg.freeze_schedule or cfg.freeze == "auto"):
        # A worker that joins mid-run builds its optimizer before it learns the epoch, or the
        # policy's decisions.
        key = "freeze_schedule" if cfg.freeze_schedule else "freeze: auto"
        raise ConfigError(f"{key}: not with elastic: true",
                          fixes=((["--freeze-schedule", "{}"] if cfg.freeze_schedule else ["--freeze", "0"]),
                                 ["--no-elastic"]))
    if cfg.freeze == "auto" and cfg.freeze_schedule:
        raise ConfigError("freeze_schedule: not with freeze: auto (the policy decides what is frozen)",
                          fixes=(["--freeze-schedule", "{}"], ["--freeze", "0"]))
    if cfg.freeze == "auto" and cfg.sync == "mpi-async-ps":
        # Its workers' gradients are their own, never averaged: ranks would decide apart.
        raise ConfigError("freeze: auto needs gradients averaged over the ranks, and sync: "
                          "mpi-async-ps has none", fixes=(["--freeze", "0"], ["--sync", "horovod"]))


def validate_compression(cfg) -> None:
    """compression and fp16_allreduce (one setting, two spellings: compression is the one the
    run uses, fp16_allreduce follows it) and the schemes' keys: in range, with a sync method
    that runs them, and not with what they cannot honour."""
    if cfg.fp16_allreduce and cfg.compression not in ("none", "fp16"):
        raise ConfigError(f"fp16_allreduce: true means compression: fp16, which conflicts with "
                          f"compression: {cfg.compression}", fixes=(["--no-fp16-allreduce"], ["--compression", "fp16"]))
    if cfg.fp16_allreduce:
        cfg.compression = "fp16"
    cfg.fp16_allreduce = cfg.compression == "fp16"
    registry.validate_settings(cfg)
    if cfg.local_sgd_steps > 1 and cfg.compression != "none":
        raise ConfigError(f"local_sgd_steps: averages whole models every {cfg.local_sgd_steps} updates, "
                          f"not with compression: {cfg.compression}",
                          fixes=(["--local-sgd-steps", "1"], ["--compression", "none"]))
    if not runs_a_scheme(cfg.compression, cfg.local_sgd_steps):
        return
    what = f"local_sgd_steps: {cfg.local_sgd_steps}" if cfg.local_sgd_steps > 1 else f"compression: {cfg.compression}"
    if cfg.sync not in SCHEME_SYNC_METHODS:
        raise ConfigError(f"{what}: needs sync: {' or '.join(SCHEME_SYNC_METHODS)}, got sync: {cfg.sync}",
                          fixes=tuple(["--sync", method] for method in SCHEME_SYNC_METHODS))
    if cfg.elastic:
        raise ConfigError(f"{what}: not with elastic: true (its state is not part of a commit)",
                          fixes=(["--no-elastic"],))
    if cfg.comm_timeline:
        raise ConfigError(f"{what}: not with comm_timeline: true (it communicates after backward, "
                          f"nothing is overlapped to time)", fixes=(["--no-comm-timeline"],))
    if cfg.amp == "fp16" and cfg.local_sgd_steps == 1:
        raise ConfigError(f"{what}: not with amp: fp16 (its error feedback would carry loss-scaled "
                          f"gradients across changes of the scale)", fixes=(["--amp", "bf16"], ["--amp", "none"]))
    registry.check(cfg)
    if cfg.freeze == "auto" and cfg.local_sgd_steps > 1:
        raise ConfigError(f"{what}: not with freeze: auto, which measures averaged gradients "
                          f"(local SGD averages none after its warm-up)", fixes=(["--freeze", "0"],))


# Keys that do nothing under the other settings: (key or key prefix, when it is inert, why).
# A key the user gave (YAML or flag) that is inert gets one warning line and is recorded in
# meta.json ("inert_keys"); the run still trains.
_INERT = (
    ("compression_warmup_steps", lambda c: not runs_a_scheme(c.compression, c.local_sgd_steps),
     lambda c: "the warm-up of powersgd, topk and local SGD, and none of them runs"),
    ("horovod_", lambda c: c.sync != "horovod", lambda c: f"Horovod's own tuning, and sync is {c.sync}"),
    ("ps_servers", lambda c: c.sync != "mpi-async-ps", lambda c: f"the parameter server's, and sync is {c.sync}"),
    ("commit_every", lambda c: not c.elastic, lambda c: "elastic training's commit period, and elastic is false"),
    ("liveness_timeout_s", lambda c: c.elastic, lambda c: "elastic training's driver handles a worker that goes away"),
    ("freeze_auto_threshold", lambda c: c.freeze != "auto", lambda c: f"freeze: auto's threshold, and freeze is {c.freeze}"),
    ("synthetic_size", lambda c: c.dataset != "synthetic", lambda c: f"the synthetic data set's size, and dataset is {c.dataset}"),
    ("shapes_", lambda c: c.dataset != "shapes", lambda c: f"the generated data set's, and dataset is {c.dataset}"),
    ("download", lambda c: c.dataset in ("digits", "synthetic", "shapes"), lambda c: f"{c.dataset} is not downloaded"),
    ("data_dir", lambda c: c.dataset in ("digits", "synthetic"), lambda c: f"{c.dataset} is not read from a folder"),
)


def inert_keys(cfg, given: set[str]) -> dict[str, str]:
    """{key: why it does nothing here} for each key in ``given`` that has no effect under the
    validated ``cfg``'s other settings."""
    out = {}
    for key in sorted(given):
        if key in registry.settings() and (why := registry.inert(cfg, key)):
            out[key] = why
        for name, inert, why in _INERT:
            if (key == name or (name.endswith("_") and key.startswith(name))) and inert(cfg):
                out[key] = why(cfg)
    return out
