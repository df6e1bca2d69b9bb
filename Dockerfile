# syntax=docker/dockerfile:1
# shmlink, the node agent image:
#   docker build -t shmlink:0.1.0 .
# For x86_64 and aarch64 nodes (GH200, GB200) in one multi-platform image:
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/shmlink:0.1.0 --push .
# Nothing here names an architecture: each platform builds natively (on a builder of that
# architecture, or under QEMU emulation, which is slow for a Rust build) from the same
# multi-arch base images.
#
# Build stage: Rust 1.95 on Debian 12. Runtime: Debian 12 slim (glibc and ld.so, because NVML
# is dlopen'ed at run time: the NVIDIA container runtime injects libnvidia-ml.so.1 and runs
# ldconfig in the container; without a GPU the agent runs shm-only). Nothing else is installed.

FROM rust:1.95-bookworm AS build
# Set by buildx; keeps the platforms' target caches apart when they build side by side.
ARG TARGETPLATFORM
ENV DEBIAN_FRONTEND=noninteractive \
    CARGO_TERM_COLOR=never \
    CARGO_NET_RETRY=5
WORKDIR /src
# The workspace: the manifest names the fake-nvml members and the benchmark targets under
# bench/, so they come along (bench/'s Rust sources only); tests and the benchmark scripts are
# left out (.dockerignore).
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY bench ./bench
COPY src ./src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,id=shmlink-target-${TARGETPLATFORM},target=/src/target \
    cargo build --release --locked --bin shmlink \
    && install -D -m 0755 target/release/shmlink /out/shmlink

FROM debian:bookworm-slim AS runtime
ARG VERSION=0.1.0
# The repository the image is built from, e.g. --build-arg SOURCE=https://...
ARG SOURCE=""
LABEL org.opencontainers.image.title="shmlink" \
      org.opencontainers.image.description="Node agent for Kubernetes GPU clusters: per-container /dev/shm and GPU link health" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
COPY --from=build /out/shmlink /usr/local/bin/shmlink
# Root inside the container: reading /proc of root-owned processes needs it. The DaemonSet
# drops every capability but SYS_PTRACE and DAC_READ_SEARCH and mounts the root read-only.
USER 0:0
EXPOSE 9477
ENTRYPOINT ["/usr/local/bin/shmlink"]
CMD ["serve"]
