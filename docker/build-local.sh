#!/usr/bin/env bash
# Builds the CPU image from docker/Dockerfile (target cpu, WEIGHTS=offline) on a machine that
# reaches the package registries (Debian, PyPI, npm) but no image registry, the way the tests do:
#
#   docker/build-local.sh image [TAG]   all of the below, then the image (default kokoro-fleet:cpu)
#   docker/build-local.sh gpu [TAG]     the same for the `gpu` target (default kokoro-fleet:gpu): not
#                                       in CI (about 2.7 GB of CUDA wheels from PyPI)
#   docker/build-local.sh engine        start a Docker engine unless one answers (installs docker.io)
#   docker/build-local.sh bases         the local stand-in base images (made once, then kept)
#   docker/build-local.sh stop-engine   stop the engine this script started, if it did
#
# The Dockerfile is built as it is; only build arguments differ from a user's build:
# - the base images are local stand-ins made from Debian packages: `debootstrap --variant=minbase
#   bookworm` imported as local/debian:bookworm, then python3 (for python:3.11-slim-bookworm),
#   nodejs/npm (for node:22-bookworm-slim) and redis-server (for compose's redis:7-alpine); for the
#   GPU target, local/cuda:13.0.2-base-bookworm stands in for nvidia/cuda:13.0.2-base-ubuntu22.04
#   with that image's environment for the NVIDIA container toolkit but NOT its CUDA runtime
#   (NVIDIA's apt repository is out of reach; torch's wheels carry their own runtime), on Debian,
#   whose Python 3.11 packages have the names Ubuntu 22.04's have;
# - torch comes from docker/local_torch_index.py, which serves the CPU wheel found on this disk
#   (pip's find-links) and sends every other project to PyPI, as PyTorch's CPU index would;
# - the engine's own builder is used (DOCKER_BUILDKIT=0): BuildKit would fetch the frontend named
#   by the Dockerfile's `# syntax=` line from Docker Hub. This builder builds every stage before the
#   target in file order: the Dockerfile puts cpu before gpu-build, so the CPU image never builds the
#   CUDA stages (on a cold cache they cost minutes). CUDA_IMAGE still names the stand-in, in case
#   a builder resolves every stage's base before it starts.
#
# Kept between runs on one machine: Docker's layer cache and images (/var/lib/docker) and, under
# $KOKORO_DOCKER_CACHE (~/.cache/kokoro-fleet-docker), the Debian root file system's tarball, the
# engine's log and which storage driver works here. Every step is bounded by a timeout.
set -Eeuo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KOKORO_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kokoro-fleet-docker}
mkdir -p "$cache"
export DOCKER_BUILDKIT=0

DEBIAN_IMAGE=local/debian:bookworm
PYTHON_IMAGE=local/python:3.11-slim-bookworm
NODE_IMAGE=local/node:bookworm-slim
REDIS_IMAGE=local/redis:bookworm
CUDA_STAND_IN=local/cuda:13.0.2-base-bookworm

log() { printf 'build-local: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}
# Root's commands (apt-get, debootstrap, dockerd): as they are for root, through sudo otherwise.
SUDO=()
[[ $(id -u) == 0 ]] || SUDO=(sudo)
elapsed() { echo "$((SECONDS - $1))s"; }

# --- the engine -------------------------------------------------------------------------------

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

install_packages() {
    local missing=() p
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    ((${#missing[@]})) || return 0
    log "installing ${missing[*]} (apt-get)"
    timeout 300 "${SUDO[@]}" apt-get update -qq
    timeout 600 "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o Acquire::Retries=3 "${missing[@]}" >/dev/null
}

# A one-binary image (the host's /usr/bin/true and its libraries): runs a container without any
# image registry, to see whether a storage driver works here.
probe_image() {
    docker image inspect local/probe:true >/dev/null 2>&1 && return 0
    local files
    mapfile -t files < <(ldd /usr/bin/true | grep -o '/[^ ]*' | sed 's|^/||')
    tar -C / -ch usr/bin/true "${files[@]}" 2>/dev/null | timeout 60 docker import - local/probe:true >/dev/null
}

stop_engine() {
    local pidfile=$cache/dockerd.pid pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    rm -f "$pidfile"
    kill -0 "$pid" 2>/dev/null || return 0
    log "stopping the engine (pid $pid)"
    "${SUDO[@]}" kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.5
    done
    "${SUDO[@]}" kill -KILL "$pid" 2>/dev/null || true
}

# Starts dockerd with the given storage driver ("" for the engine's choice) and waits for it.
launch_engine() {
    local driver=$1 args=(--iptables=false --bridge=none)
    [[ -n $driver ]] && args+=(--storage-driver "$driver")
    log "starting dockerd ${args[*]} (log: $cache/dockerd.log)"
    # setsid and closed descriptors: the engine outlives this script without holding its pipes,
    # nor the build lock (fd 9): an engine that inherited it held the lock for its whole life, and
    # every later `image` build waited out flock's two hours behind it.
    local stale
    # An engine killed with its session leaves its pid file; dockerd refuses to start while that
    # pid names a live process, which after a restart can be any other program.
    stale=$(cat /var/run/docker.pid 2>/dev/null || true)
    if [[ -n $stale ]] && [[ $(cat "/proc/$stale/comm" 2>/dev/null) != dockerd ]]; then
        "${SUDO[@]}" rm -f /var/run/docker.pid
    fi
    "${SUDO[@]}" setsid dockerd "${args[@]}" >>"$cache/dockerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$cache/dockerd.pid"
    for _ in $(seq 60); do
        engine_answers && return 0
        kill -0 "$(cat "$cache/dockerd.pid")" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}

start_engine() {
    if engine_answers; then
        log "engine: $(docker info --format '{{.ServerVersion}}, {{.Driver}}') already answers"
        return 0
    fi
    install_packages docker.io fuse-overlayfs
    local known drivers=() driver started=$SECONDS
    known=$(cat "$cache/storage-driver" 2>/dev/null || true)
    [[ -z $known ]] || drivers+=("$known")
    drivers+=("" fuse-overlayfs vfs) # "": the engine's choice (overlay2 where the kernel allows)
    for driver in "${drivers[@]}"; do
        if launch_engine "$driver" && probe_image \
            && timeout 60 docker run --rm --network none local/probe:true /usr/bin/true; then
            docker info --format '{{.Driver}}' >"$cache/storage-driver"
            log "engine: $(docker info --format '{{.ServerVersion}}, storage driver {{.Driver}}') up in $(elapsed "$started")"
            return 0
        fi
        log "the engine does not run containers with storage driver '${driver:-default}' here"
        stop_engine
    done
    die "no storage driver works here (see $cache/dockerd.log)"
}

# --- the stand-in bases -----------------------------------------------------------------------

debian_mirror() {
    # shellcheck disable=SC2016  # apt's own $(FIELD) syntax
    apt-get indextargets --format '$(SITE) $(RELEASE)' 2>/dev/null | awk '$2 == "bookworm" { print $1; exit }' | grep . \
        || echo http://deb.debian.org/debian
}

debian_base() {
    docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1 && return 0
    local tarball=$cache/debian-bookworm-minbase.tar started=$SECONDS
    if [[ ! -s $tarball ]]; then
        install_packages debootstrap
        local mirror dir attempt
        mirror=$(debian_mirror)
        dir=$(mktemp -d "$cache/rootfs.XXXXXX")
        for attempt in 1 2; do
            log "debootstrap --variant=minbase bookworm from $mirror (attempt $attempt)"
            if timeout 900 "${SUDO[@]}" debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$cache/debootstrap.log" 2>&1; then
                break
            fi
            ((attempt == 2)) && die "debootstrap failed (see $cache/debootstrap.log)"
            "${SUDO[@]}" rm -rf "$dir" && mkdir -p "$dir"
        done
        "${SUDO[@]}" rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
        printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" | "${SUDO[@]}" tee "$dir/etc/apt/sources.list" >/dev/null
        "${SUDO[@]}" tar -C "$dir" -cf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
        "${SUDO[@]}" rm -rf "$dir"
    fi
    timeout 300 docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' "$tarball" "$DEBIAN_IMAGE" >/dev/null
    log "$DEBIAN_IMAGE made in $(elapsed "$started")"
}

# The certificate authorities this host trusts, for the stand-ins: where the registries are reached
# through a TLS-inspecting proxy (as on our CI machines), its CA is in the host's bundle only.
HOST_CA_BUNDLE=${KOKORO_DOCKER_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

# Builds a stand-in from a Dockerfile on stdin (its context: the host's CA bundle as
# host-ca-certificates.crt), unless an image made from the same text and bundle exists.
stand_in() {
    local tag=$1 recipe recipe_hash context started=$SECONDS
    recipe=$(cat)
    context=$(mktemp -d)
    cp "$HOST_CA_BUNDLE" "$context/host-ca-certificates.crt"
    recipe_hash=$(cat - "$context/host-ca-certificates.crt" <<<"$recipe" | sha256sum | cut -c1-16)
    if [[ $(docker image inspect -f '{{index .Config.Labels "kokoro-fleet.recipe"}}' "$tag" 2>/dev/null) == "$recipe_hash" ]]; then
        rm -rf "$context"
        return 0
    fi
    log "building stand-in $tag"
    printf '%s\n' "$recipe" >"$context/Dockerfile"
    timeout 900 docker build --network host -q --label "kokoro-fleet.recipe=$recipe_hash" -t "$tag" "$context" >/dev/null \
        || { rm -rf "$context"; die "building $tag failed"; }
    rm -rf "$context"
    log "$tag made in $(elapsed "$started")"
}

APT_INSTALL='apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o Acquire::Retries=3'
# Debian's official images delete downloaded packages after every install (their base images, and
# so python:*-slim, carry an apt setting for it); the Dockerfile's apt steps count on that.
APT_LIKE_OFFICIAL_IMAGES='RUN printf '\''%s\n'\'' \
    '\''DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };'\'' \
    '\''APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };'\'' \
    '\''Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";'\'' >/etc/apt/apt.conf.d/docker-clean'
# After ca-certificates: the host's CAs join the image's bundle (update-ca-certificates keeps them).
TRUST_HOST_CAS='COPY host-ca-certificates.crt /usr/local/share/ca-certificates/host-ca-certificates.crt
RUN update-ca-certificates >/dev/null'

make_bases() {
    debian_base
    stand_in "$PYTHON_IMAGE" <<EOF
FROM $DEBIAN_IMAGE
$APT_LIKE_OFFICIAL_IMAGES
# pip keeps its own CA list unless told to use the system's.
ENV LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN $APT_INSTALL ca-certificates python3 python3-venv python-is-python3 && rm -rf /var/lib/apt/lists/*
$TRUST_HOST_CAS
CMD ["python3"]
EOF
    stand_in "$NODE_IMAGE" <<EOF
FROM $DEBIAN_IMAGE
$APT_LIKE_OFFICIAL_IMAGES
# Node keeps its own CA list unless given more.
ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
RUN $APT_INSTALL ca-certificates nodejs npm && rm -rf /var/lib/apt/lists/*
$TRUST_HOST_CAS
CMD ["node"]
EOF
    # The official image runs redis-server with protected mode off (it accepts other containers
    # without a password); Debian's binary needs the flag.
    stand_in "$REDIS_IMAGE" <<EOF
FROM $DEBIAN_IMAGE
$APT_LIKE_OFFICIAL_IMAGES
RUN $APT_INSTALL redis-server redis-tools && rm -rf /var/lib/apt/lists/* \\
    && printf '#!/bin/sh\nexec /usr/bin/redis-server "\$@" --protected-mode no\n' >/usr/local/bin/redis-server \\
    && chmod +x /usr/local/bin/redis-server
EXPOSE 6379
CMD ["redis-server"]
EOF
}

# NVIDIA's base image, its environment only: what the container toolkit reads (which driver
# capabilities to mount, the CUDA the image needs), the CUDA version, the paths its hooks fill.
make_cuda_base() {
    stand_in "$CUDA_STAND_IN" <<EOF
FROM $DEBIAN_IMAGE
$APT_LIKE_OFFICIAL_IMAGES
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility NVIDIA_REQUIRE_CUDA="cuda>=13.0" \\
    CUDA_VERSION=13.0.2 LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64 \\
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN $APT_INSTALL ca-certificates && rm -rf /var/lib/apt/lists/*
$TRUST_HOST_CAS
EOF
}

# --- the image --------------------------------------------------------------------------------

# The folder holding torch's CPU wheel for the image's Python (3.11), from pip's find-links.
torch_wheel_dir() {
    local version dir
    version=$(sed -n 's/^ARG TORCH_SPEC=torch==//p' "$root/docker/Dockerfile")
    for dir in ${TORCH_WHEEL_DIR:-} ${PIP_FIND_LINKS:-} $(pip3 config get global.find-links 2>/dev/null || true) /opt/wheels; do
        dir=${dir#file://}
        compgen -G "$dir/torch-$version+cpu-cp311-*x86_64.whl" >/dev/null && { echo "$dir"; return 0; }
    done
    return 1
}

index_pid=
# shellcheck disable=SC2317  # called from a trap
cleanup() { [[ -z $index_pid ]] || kill "$index_pid" 2>/dev/null || true; }

# The build arguments both targets share (in the caller's `args`), with the local torch index
# started when torch's CPU wheel is on this disk.
build_args() {
    local wheels url
    args=(--build-arg WEIGHTS=offline --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" --build-arg "NODE_IMAGE=$NODE_IMAGE")
    if wheels=$(torch_wheel_dir); then
        trap cleanup EXIT
        coproc INDEX { exec python3 "$root/docker/local_torch_index.py" "$wheels" 2>"$cache/index.log"; }
        # shellcheck disable=SC2153  # INDEX_PID is set by coproc
        index_pid=$INDEX_PID
        read -r -t 20 url <&"${INDEX[0]}" || die "the local torch index did not start (see $cache/index.log)"
        log "torch from $wheels through $url"
        args+=(--build-arg "TORCH_CPU_INDEX_URL=$url")
    else
        log "no torch CPU wheel on this disk: torch comes from PyTorch's CPU index"
    fi
}

# `docker build` of one target of the Dockerfile with the shared arguments (left in the caller's
# `args`), CUDA_IMAGE naming its CUDA base.
build_target() {
    local tag=$1 target=$2 cuda_image=$3
    build_args
    args+=(--build-arg "CUDA_IMAGE=$cuda_image")
    log "docker build --target $target ${args[*]} -t $tag"
    timeout "${KOKORO_DOCKER_BUILD_TIMEOUT:-3600}" docker build --network host -f "$root/docker/Dockerfile" \
        --target "$target" "${args[@]}" -t "$tag" "$root"
}

image_size() { docker image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }

build_image() {
    local tag=$1 started=$SECONDS args
    # CUDA_IMAGE names a stand-in in case a builder resolves every stage's base before it starts.
    build_target "$tag" cpu "$PYTHON_IMAGE"
    # This builder's cache is its intermediate images. The other stages' results are no ancestors
    # of the image, so they get tags of their own (all cached: seconds); then the images of earlier
    # builds that nothing uses any more can go without taking this build's cache with them.
    local stage
    for stage in npm-voices weights; do
        timeout 900 docker build --network host -q -f "$root/docker/Dockerfile" --target "$stage" "${args[@]}" \
            -t "kokoro-fleet-build-cache:$stage" "$root" >/dev/null
    done
    timeout 300 docker image prune -f >/dev/null || true
    log "built $tag in $(elapsed "$started"), $(image_size "$tag")"
}

# The GPU target: every stage before it too (this builder goes in file order), the CPU ones from
# the cache when the CPU image was built. Nothing is pruned: the CPU image's cache stays.
build_gpu_image() {
    local tag=$1 started=$SECONDS args
    build_target "$tag" gpu "$CUDA_STAND_IN"
    log "built $tag in $(elapsed "$started"), $(image_size "$tag")"
}

main() {
    local command=${1:-image}
    case $command in
        engine) start_engine ;;
        bases) start_engine && make_bases ;;
        image)
            local started=$SECONDS
            exec 9>"$cache/build.lock"
            flock -w 7200 9 || die "another build holds $cache/build.lock"
            start_engine
            install_packages docker-compose # for tests/servers/test_docker.py's compose test
            make_bases
            build_image "${2:-kokoro-fleet:cpu}"
            log "done in $(elapsed "$started")"
            ;;
        gpu)
            local started=$SECONDS
            exec 9>"$cache/build.lock"
            flock -w 7200 9 || die "another build holds $cache/build.lock"
            start_engine
            make_bases
            make_cuda_base
            build_gpu_image "${2:-kokoro-fleet:gpu}"
            log "done in $(elapsed "$started")"
            ;;
        stop-engine) stop_engine ;;
        *) die "usage: $0 image [TAG] | gpu [TAG] | engine | bases | stop-engine" ;;
    esac
}

# On one line, so that bash has read the whole file before it runs: editing the script while a
# build runs cannot change what this run does.
main "$@"; exit
