#!/usr/bin/env bash
# The README's two commands on a fresh machine, as a new contributor runs them:
#
#   1. a container from the locally made Debian base ($BASE_TAG, made by `infra/test-images.sh
#      base` when missing): python3 with venv and pip, CA certificates, nothing else; no
#      PostgreSQL, Redis, RabbitMQ, chromium or compiler (checked inside before anything runs),
#      on a network of its own (its loopback is not this machine's, where servers run). Then the
#      one system library the README asks for (libgomp1: the OpenMP runtime the llama.cpp
#      engine's wheel links to; nearly every Linux has it, a minimal Debian does not), and,
#      before the test command, the C compiler and Python headers it asks for (pycosat, which
#      reasoning-gym pins, has no wheel on PyPI)
#   2. a clean clone of this repository's HEAD (committed files only) copied into /root/conductor
#   3. the README's "Run it" command block, then its "Test it" block, read from the clone's
#      README and run line by line, as written, in one bash shell in the clone (the first
#      activates .venv, which the second uses); the first line that fails stops the run
#
# Each block's wall time, and the whole run's, is printed at the end; the exit code is the
# first failing line's (0 when both blocks passed).
#
# Usage: infra/fresh-machine.sh        (root: rootful podman, as infra/test-images.sh)
#
# Settings (environment):
#   BASE_TAG         base image                              (localhost/debian-python:bookworm)
#   OCI_RUNTIME      podman's runtime                        (runc)
#   FRESH_NETWORK    the container's network                 (podman's default bridge)
#   WHEELS           this machine's folder of prebuilt wheels, mounted read-only with
#                    PIP_FIND_LINKS as the machines of this project have it: `pip install
#                    torch==2.13.0` takes the CPU build there (/opt/wheels when it exists)
#   PIP_CONSTRAINTS  folder of pip's machine-wide configuration, mounted likewise
#                    (/etc/xdg/pip when it exists)
#   CA_BUNDLE        CA bundle for pip                       (/etc/ssl/certs/ca-certificates.crt)
#   FRESH_TEST_ARGS  extra pytest arguments appended to the README's pytest line, for a quick
#                    partial check (a selection of tests); the run then says it was not the
#                    README's command as written. CI leaves it unset.
#   KEEP             1: keep the container and the clone afterwards (0)
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE_TAG=${BASE_TAG:-localhost/debian-python:bookworm}
OCI_RUNTIME=${OCI_RUNTIME:-runc}
FRESH_NETWORK=${FRESH_NETWORK:-}
WHEELS=${WHEELS-$([[ -d /opt/wheels ]] && echo /opt/wheels)}
PIP_CONSTRAINTS=${PIP_CONSTRAINTS-$([[ -d /etc/xdg/pip ]] && echo /etc/xdg/pip)}
CA_BUNDLE=${CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
FRESH_TEST_ARGS=${FRESH_TEST_ARGS:-}
KEEP=${KEEP:-0}

RUN_ID="$(date -u +%Y%m%d%H%M%S)-$$"
NAME="conductor-fresh-${RUN_ID}"
WORK_DIR=""
STARTED=$SECONDS

log() { printf '[fresh-machine %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
    printf '\n[fresh-machine] FAILED: %s\n\n' "$*" >&2
    exit 1
}

cleanup() {
    local code=$?
    set +e
    trap - EXIT INT TERM
    if [[ $KEEP == 1 ]]; then
        log "kept: container ${NAME}, clone ${WORK_DIR}"
    else
        podman rm -f -t 5 "$NAME" >/dev/null 2>&1
        [[ -n $WORK_DIR ]] && rm -rf --one-file-system "$WORK_DIR"
    fi
    log "finished in $((SECONDS - STARTED)) s, exit code ${code}"
    exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

[[ $(id -u) == 0 ]] || die "run as root (rootful podman, as infra/test-images.sh)"
command -v podman >/dev/null || die "podman is not installed (apt-get install podman runc)"
if ! podman image exists "$BASE_TAG"; then
    log "no ${BASE_TAG}: making it with infra/test-images.sh base"
    BASE_TAG=$BASE_TAG OCI_RUNTIME=$OCI_RUNTIME bash "$REPO_ROOT/infra/test-images.sh" base
fi

WORK_DIR=$(mktemp -d /var/tmp/conductor-fresh.XXXXXX)
# A clone, not a copy of this work tree: what a contributor gets (no .venv, build output or
# uncommitted file of ours).
git clone --quiet --no-hardlinks "$REPO_ROOT" "$WORK_DIR/conductor"
log "clone of $(git -C "$WORK_DIR/conductor" rev-parse --short HEAD) made"

# The README's blocks, as written: the first ```bash block under "## Run it", then the one under
# "## Test it". Each line becomes a step of one shell script that stops at the first failure.
python3 - "$WORK_DIR/conductor/README.md" "$WORK_DIR/steps.sh" "$FRESH_TEST_ARGS" <<'EOF'
import re
import shlex
import sys
from pathlib import Path

readme, out, test_args = Path(sys.argv[1]).read_text(), Path(sys.argv[2]), sys.argv[3]


def block(heading: str) -> list[str]:
    section = readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    if found is None:
        sys.exit(f"no bash block under '## {heading}' in the README")
    return [line for line in found.group(1).splitlines() if line.strip()]


script = ["cd /root/conductor"]
for name, heading in (("run-it", "Run it"), ("test-it", "Test it")):
    if name == "test-it":
        # The test extras' one package without a wheel (pycosat, pinned by reasoning-gym) is
        # compiled: the README asks for a C compiler and Python's headers.
        script.append("echo 'FRESH: apt-get install gcc libc6-dev python3-dev (the README asks)'")
        script.append(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
            "gcc libc6-dev python3-dev >/dev/null || exit 4"
        )
    script.append(f"echo '== README {heading}'; started=$SECONDS")
    for line in block(heading):
        if test_args and line.startswith("python -m pytest"):
            line = f"{line} {test_args}"
            script.append("echo " + shlex.quote(f"NOT as written: pytest arguments added: {test_args}"))
        script.append(f"echo {shlex.quote('$ ' + line)}")
        script.append(line)
        script.append(
            "rc=$?; if ((rc)); then echo \"FRESH FAILED (exit $rc) in '" + heading + "': \""
            + shlex.quote(line) + "; exit $rc; fi"
        )
    script.append(f"echo \"FRESH {name} $((SECONDS - started)) s\"")
out.write_text("\n".join(script) + "\n")
EOF

# Nothing but Python: no server, browser or compiler installed, and none answering on the
# loopback (the container's own, not this machine's).
cat >"$WORK_DIR/fresh-check.sh" <<'EOF'
found=""
for tool in postgres initdb pg_ctl psql redis-server valkey-server rabbitmq-server rabbitmqctl chromium gcc cc; do
    command -v "$tool" >/dev/null && found="$found $tool"
done
[[ -z $found ]] || { echo "FRESH: not a fresh machine, installed:$found"; exit 3; }
python3 - <<'PY'
import socket, sys
for port in (5432, 6379, 5672):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        continue
    sys.exit(f"FRESH: something answers on 127.0.0.1:{port}")
print(f"FRESH: {sys.version.split()[0]}; no PostgreSQL, Redis, RabbitMQ, chromium or compiler")
PY
[[ $? == 0 ]] || exit 3
echo "FRESH: apt-get install libgomp1 (the README's one system requirement)"
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libgomp1 >/dev/null
EOF

hard_limit() {  # as infra/test-images.sh: the shell's hard ulimit, capped
    local value
    value=$(ulimit -H "$1")
    if [[ $value == unlimited || $value -gt $2 ]]; then value=$2; fi
    echo "$value"
}
nofile=$(hard_limit -n 65536)
nproc=$(hard_limit -u 32768)
args=(--runtime "$OCI_RUNTIME" --name "$NAME" --no-healthcheck
    --ulimit "nofile=${nofile}:${nofile}" --ulimit "nproc=${nproc}:${nproc}"
    --shm-size 1g --workdir /root -e PIP_DISABLE_PIP_VERSION_CHECK=1 -e PIP_DEFAULT_TIMEOUT=180)
[[ -n $FRESH_NETWORK ]] && args+=(--network "$FRESH_NETWORK")
if [[ -n $WHEELS ]]; then
    args+=(-v "$WHEELS:$WHEELS:ro" -e "PIP_FIND_LINKS=$WHEELS")
fi
[[ -n $PIP_CONSTRAINTS ]] && args+=(-v "$PIP_CONSTRAINTS:/etc/xdg/pip:ro")
if [[ -n $CA_BUNDLE ]]; then
    args+=(-v "$CA_BUNDLE:/etc/ssl/host-ca.crt:ro" -e PIP_CERT=/etc/ssl/host-ca.crt)
fi
podman create "${args[@]}" "$BASE_TAG" \
    bash -c 'bash /root/fresh-check.sh && bash /root/steps.sh' >/dev/null
podman cp "$WORK_DIR/conductor" "$NAME:/root/conductor"
podman cp "$WORK_DIR/steps.sh" "$NAME:/root/steps.sh"
podman cp "$WORK_DIR/fresh-check.sh" "$NAME:/root/fresh-check.sh"
log "container ${NAME} from ${BASE_TAG}: the README's commands (log: ${WORK_DIR}/run.log)"

set +e
podman start --attach "$NAME" 2>&1 | tee "$WORK_DIR/run.log"
status=${PIPESTATUS[0]}
set -e
if [[ $status -eq 0 ]]; then
    status=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
fi
log "times: $(grep -o '^FRESH [a-z-]* [0-9]* s' "$WORK_DIR/run.log" | sed 's/^FRESH //' | paste -sd ';' -)"
if [[ $status -ne 0 ]]; then
    die "the README's commands failed in a fresh container (exit ${status}; output above)"
fi
log "PASSED: the README's two commands in a fresh container$([[ -n $FRESH_TEST_ARGS ]] && echo ", pytest with extra arguments: ${FRESH_TEST_ARGS}")"
