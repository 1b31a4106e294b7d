"""hvd_cifar: data-parallel CNN training with Horovod."""
