"""An epoch's figures over all ranks, and its metrics.jsonl line.

Every rank measures its own pass (phase times, its process's resources) and one rank per host
that host's NIC bytes and CPUs; ``reduce_epoch`` brings them together with the epoch end's
collectives, and ``epoch_record`` writes them into the one line per epoch that reports, plots
and TensorBoard are made from (docs/ARCHITECTURE.md, "Measurements are data").
"""
from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass

import torch

from hvd_cifar.core.names import PER_IMAGE_FIELD, PHASES
from hvd_cifar.trainer import resources, steptrace


@dataclass
class Measured:
    """What this rank's meters read around one epoch's training."""
    interface: str | None                # the NIC counted (one rank per host), else None
    nic_bytes: tuple[int, int]           # (received, sent) on it
    rank_figures: list[float]            # resources.RANK_FIELDS of this process
    host_cpu_percent: float | None       # the host's CPUs (one rank per host), else None


def reduce_epoch(sync, state, result, measured: Measured, cuda: bool):
    """The epoch's figures over all ranks, by the epoch end's collectives: one allgather (each
    host's NIC bytes and CPU), the sums' allreduce, and one allreduce of every rank's phase times
    with its resource figures in its own slot; with comm_timeline: true one more allgather, of
    the steps each rank traced (trainer.steptrace). ``result``: this rank's epoch.EpochResult.
    Returns (the epoch's SUMS, images of this pass, the metrics line's measured figures)."""
    host = (socket.gethostname(), measured.interface, *measured.nic_bytes, measured.host_cpu_percent)
    per_host = [entry for entry in sync.allgather_object(host if measured.host_cpu_percent is not None else None)
                if entry]  # (host, interface, rx, tx, cpu %)
    nic = [entry for entry in per_host if entry[1]]
    reduced = sync.allreduce_sum(result.sums.cpu())
    # Each rank timed its own phases (0 where a rank does not train); report the mean over the
    # ranks that train, which adds up to the step time.
    own = torch.cat([torch.tensor([result.phase_times[p] for p in PHASES], dtype=torch.float64),
                     resources.pack(measured.rank_figures, sync.rank, sync.size),
                     resources.per_image(result.cpu_s, result.sums[2].item(), sync.rank, sync.size)])
    summed = sync.allreduce_sum(own)
    phase_times = summed[:len(PHASES)] / sync.workers
    per_image = summed[-sync.size:].tolist()
    trace = steptrace.gather(sync, result.window, sync.comm_spans()) if result.window is not None else None
    return state.epoch_sums(reduced), reduced[2].item(), {
        **({"step_trace": trace} if trace else {}),
        **{f"{phase}_time_s": phase_times[j].item() for j, phase in enumerate(PHASES)},
        "nic_interface": {h: iface for h, iface, *_ in nic},
        "nic_rx_bytes": {h: rx for h, _, rx, _, _ in nic},
        "nic_tx_bytes": {h: tx for h, _, _, tx, _ in nic},
        **resources.record(summed[len(PHASES):-sync.size], sync.size, cuda, {h: cpu for h, *_, cpu in per_host}),
        PER_IMAGE_FIELD: {str(rank): value for rank, value in enumerate(per_image)},
    }


def epoch_record(run, epoch: int, result, sums: torch.Tensor, pass_images: float, figures: dict, test,
                 eval_time_s: float) -> dict:
    """The metrics.jsonl line of ``epoch``: ``run`` is the context.Training,
    ``result`` this rank's epoch.EpochResult, ``sums`` the epoch's SUMS over all ranks,
    ``pass_images`` the images of this pass, ``figures`` reduce_epoch's, ``test`` the
    loop.Evaluation."""
    sync, cfg, trainable = run.setup.sync, run.setup.cfg, run.trainable
    loss, correct, images, correct5 = sums.tolist()
    wire = sync.wire_bytes_per_sync(trainable.payload_bytes)
    record = {
        "epoch": epoch, "lr": result.lr,
        "train_loss": loss / images, "train_acc": correct / images, "train_acc5": correct5 / images,
        "test_loss": test.loss, "test_acc": test.acc, "test_acc5": test.acc5,
        "epoch_time_s": result.time_s, "eval_time_s": eval_time_s,
        "elapsed_s": run.elapsed_s(),
        "images_per_s": pass_images / result.time_s, "steps": result.steps, "syncs": result.syncs,
        "step_time_s": result.time_s / (result.steps - result.first_step),
        **({"step_time_median_s": statistics.median(result.step_times)} if result.step_times else {}),
        "comm_bytes_per_sync": wire, "comm_bytes_per_rank": wire * result.syncs,
        "comm_bytes_per_sync_unfrozen": sync.wire_bytes_per_sync(trainable.unfrozen_payload_bytes),
        **figures,  # phase times, NIC bytes, resources
        "trainable_params": trainable.param_count, "frozen_blocks": trainable.frozen_blocks, "world_size": sync.size,
        **run.setup.freezing.record(),  # freeze: auto: its measure per block
        "sync": cfg.sync, "accumulation_steps": cfg.accumulation_steps, "batch_size": cfg.batch_size,
        **result.extra,  # what only some methods measure (mpi-async-ps: staleness, server updates/s)
        "compression": cfg.compression,  # the config's name (a scheme's extra says its own)
    }
    if result.first_step:  # elastic: the epoch was continued after a reset at step `first`
        record["resumed_at_step"] = result.first_step
    return record
