"""The scaling plot draws what a sweep's rows hold, also when a 95 % interval (about the mean)
misses the median it is drawn around by a hair, as it does when every round is alike."""
from hvd_cifar.analysis import plots


def test_an_interval_that_misses_its_median_still_plots(tmp_path):
    rows = [{"label": "horovod", "world_size": np, "images_per_s": ips, "images_per_s_low": ips * (1 + 1e-9),
             "images_per_s_high": ips * 1.01, "mean_epoch_time_s": 10.0 / np, "mean_epoch_time_s_low": 9.0 / np,
             "mean_epoch_time_s_high": 10.0 / np - 1e-9, "sync": "horovod", "model": "smallcnn",
             "dataset": "digits", "batch_size": 32, "compression": "none", "fp16_allreduce": False,
             "accumulation_steps": 1, "freeze": 0}
            for np, ips in ((1, 100.0), (2, 190.0))]
    path = plots.plot_scaling(rows, str(tmp_path / "scaling.png"))
    assert (tmp_path / "scaling.png").stat().st_size > 1000 and path.endswith("scaling.png")
