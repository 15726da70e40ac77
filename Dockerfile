# The harness with everything its faults need: FUSE (storage faults), nftables and
# iproute2 (network namespaces, partitions). Run it with the capabilities and the device
# those faults use, never --privileged (see docker-compose.yml).
#
# BASE: any Debian bookworm image with Python 3.11 and venv. With a registry, the
# default; without one, the base `torchchaos docker base` makes from Debian's packages
# (debootstrap), which already holds the system packages below, so the build installs
# nothing from apt.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
RUN dpkg -s fuse3 nftables iproute2 util-linux procps >/dev/null 2>&1 \
 || (apt-get update \
     && apt-get install -y --no-install-recommends fuse3 nftables iproute2 util-linux procps \
     && rm -rf /var/lib/apt/lists/*)
# a virtual environment: Debian's own Python refuses packages installed beside its own
RUN python3 -m venv /opt/torchchaos
ENV PATH=/opt/torchchaos/bin:$PATH
WORKDIR /src
COPY . .
# The CPU build of torch, then the harness. With a .wheels/ folder in the context (as
# `torchchaos docker build` stages it: every wheel the install needs, made on the host),
# nothing is downloaded; without one, torch comes from TORCH_INDEX and the rest from PyPI.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN if [ -d .wheels ]; then \
      pip install --no-cache-dir --no-index --find-links .wheels torch==2.13.0 -e '.[test]'; \
    else \
      pip install --no-cache-dir torch==2.13.0 --index-url "${TORCH_INDEX}" \
      && pip install --no-cache-dir -e '.[test]'; \
    fi
CMD ["torchchaos", "battery"]
