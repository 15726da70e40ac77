# The harness with everything its faults need: FUSE (storage faults), nftables and
# iproute2 (network namespaces, partitions). Run it privileged (see docker-compose.yml).
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends fuse3 nftables iproute2 util-linux \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# the CPU build: a GPU runner installs the CUDA build of the same version instead
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -e '.[test]'
CMD ["torchchaos", "battery"]
