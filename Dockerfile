# hvd_cifar: a reproducible image for single- and multi-node runs.
#
# CPU (default):  docker build -t hvd_cifar .
# GPU (NCCL):     docker build -t hvd_cifar:gpu --build-arg HOROVOD_GPU_OPERATIONS=NCCL .
#                 docker run --gpus all hvd_cifar:gpu ...   (the host's driver, NVIDIA Container Toolkit)
# The GPU image needs no nvidia/cuda: base image: torch's wheels bring CUDA's libraries, and
# scripts/build-horovod-gpu.sh takes nvcc and CUDA's headers from PyPI's wheels in torch's CUDA
# version and NCCL from the wheel torch came with (docs/INSTALL.md, "The GPU build").
# The image runs scripts/install.sh, the same script a developer and CI run, so the recipe
# is exercised on every CI run even where no Docker engine exists.
ARG BASE_IMAGE=python:3.11.7-slim-bookworm
FROM ${BASE_IMAGE}

ARG HOROVOD_GPU_OPERATIONS=
ARG APP_USER=trainer
ARG UID=1000
ENV DEBIAN_FRONTEND=noninteractive \
    HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS} \
    VENV=/opt/hvd_cifar/.venv \
    HVD_CIFAR_WHEEL_CACHE=/opt/hvd_cifar/wheels \
    PATH=/opt/hvd_cifar/.venv/bin:${PATH}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python 3.11 (scripts/install.sh also takes 3.12 and 3.13): the CPU base has it; Debian and CUDA
# (Ubuntu) bases get it from apt. sudo is not installed: the build runs as root until USER below.
# scripts/check-image.sh builds this file on a debootstrapped Debian bookworm and runs it.
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends \
        python3.11=3.11.* python3.11-venv=3.11.* python3.11-dev=3.11.* && \
      rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /opt/hvd_cifar
COPY pyproject.toml ./
COPY scripts/ scripts/
COPY hvd_cifar/ hvd_cifar/
COPY configs/ configs/
COPY hostfiles/ hostfiles/
COPY launch/ launch/
COPY docker/ docker/

# Everything (Open MPI, ssh, torch, horovod built with its fixes, the package) in one script;
# it ends with `horovodrun --check-build`, so a broken build fails the image build. /root/.cache
# holds pip's downloads and, for the GPU image, the CUDA toolkit the build used.
RUN bash scripts/install.sh && rm -rf /var/lib/apt/lists/* /root/.cache && \
    horovodrun --check-build

# Run as an unprivileged user; logs/ and data/ are the only places it writes.
RUN useradd --create-home --uid "${UID}" --shell /bin/bash "${APP_USER}" && \
    mkdir -p logs data && chown "${APP_USER}:${APP_USER}" logs data
USER ${APP_USER}

# Multi-node: start sshd on a chosen port in each container (docker/sshd.sh PORT), then
# launch from one of them with horovodrun -p PORT (see docs/DOCKER.md).
EXPOSE 2222
CMD ["launch/horovodrun.sh", "-np", "2", "--config", "configs/demo.yaml"]
