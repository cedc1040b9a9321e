#!/usr/bin/env bash
# Builds kube-apiserver and kube-controller-manager from Debian's `kubernetes` source package for the real
# Kubernetes control-plane test tier (tests/kube.py), cached under
# ${XDG_CACHE_HOME:-~/.cache}/trainforge/kube/<debian-version>-<hash of this script>/bin/ (TF_KUBE_CACHE replaces
# the .../trainforge/kube part; `build.sh --where` prints the folder; tools/cache.sh says how it is written).
#   - source: `apt-get source --download-only kubernetes` through a private apt configuration (its own
#     sources list with a deb-src line, its own lists directory; the system's apt state is not touched)
#   - toolchain: Debian's golang-1.19-go/-src (+ rsync, libpopt0 for the build scripts), unpacked with
#     `dpkg -x` into a scratch directory; nothing is installed on the system
#   - the vendored modern-go/reflect2 v1.0.1 is replaced by Debian's 1.0.2: v1.0.1 reads Go runtime internals
#     that changed in Go 1.18 and the apiserver dies with SIGSEGV in the quota evaluator
# Only the two binaries are kept (the source, toolchain and Go build cache are deleted: CI disk and cache
# size); a warm run is a no-op, in any clone on the machine. kube-scheduler and kubelet are not built: the test
# node (tests/kubenode/) schedules and runs pods, and a cold build of both would push CI past its time budget.
# Fails loudly (non-zero, with the reason) when anything cannot be had: the tier never skips.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
. "$ROOT/tools/cache.sh"
CACHE="${TF_KUBE_CACHE:-$(tf_cache_home)/kube}"
# Debian's version of the source package; the cache is keyed by it. Debian mirrors carry only the current
# version of a suite, so a newer bookworm update makes this fail with the version the mirror offers.
KUBE_DEB_VERSION="${TF_KUBE_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
GO_PKG=golang-1.19
OUT="$CACHE/$(tf_key "$KUBE_DEB_VERSION" "${BASH_SOURCE[0]}")"
BIN="$OUT/bin"
WHAT=(kube-apiserver kube-controller-manager)
say() { echo "kube build: $*" >&2; }
die() { echo "kube build FAILED: $*" >&2; exit 1; }

if [ "${1:-}" = --where ]; then echo "$OUT"; exit 0; fi

have_bins() { for b in "${WHAT[@]}"; do [ -x "$BIN/$b" ] || return 1; done; }

if have_bins; then
  echo "$BIN"
  exit 0
fi
tf_lock "$OUT"
if have_bins; then  # another run built it while this one waited
  echo "$BIN"
  exit 0
fi

command -v apt-get >/dev/null || die "apt-get is needed to fetch Debian's kubernetes source and Go toolchain"

# The Debian mirror: the one the system's apt already uses for bookworm (tools/engine/setup.sh fetches its
# packages through the same configuration), or TF_DEBIAN_MIRROR.
MIRROR="${TF_DEBIAN_MIRROR:-$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null \
  | awk '$1 == "bookworm" {print $2; exit}')}"
[ -n "$MIRROR" ] || die "no bookworm mirror in the system's apt configuration; set TF_DEBIAN_MIRROR"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$KEYRING" ] || die "$KEYRING is missing (debian-archive-keyring)"

TMP="$OUT.tmp.$$"
WORK="$TMP/work"
LOG="$OUT.build.log"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/archives/partial" "$WORK/apt/parts" "$WORK/src" "$WORK/debs" "$WORK/tc"
trap 'rm -rf "$TMP"' EXIT
cat >"$WORK/apt/sources.list" <<EOF
deb [signed-by=$KEYRING] $MIRROR bookworm main
deb-src [signed-by=$KEYRING] $MIRROR bookworm main
EOF
APT=(-o "Dir::Etc::sourcelist=$WORK/apt/sources.list" -o "Dir::Etc::sourceparts=$WORK/apt/parts"
     -o "Dir::State::Lists=$WORK/apt/lists" -o "Dir::Cache::archives=$WORK/apt/archives"
     -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Sandbox::User=root")

start=$(date +%s)
say "apt-get update (private configuration, $MIRROR bookworm main)"
apt-get "${APT[@]}" update -qq || die "apt-get update of the private configuration failed"

say "fetching kubernetes $KUBE_DEB_VERSION source"
(cd "$WORK/src" && apt-get "${APT[@]}" source -qq --download-only "kubernetes=$KUBE_DEB_VERSION") \
  || die "apt-get source kubernetes=$KUBE_DEB_VERSION failed; the mirror offers: $(apt-cache "${APT[@]}" showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2}' | tr '\n' ' ')"

say "fetching the Go toolchain ($GO_PKG) and build helpers"
# dpkg-source (dpkg-dev, libdpkg-perl) and patch unpack the source package; slim images lack them
helpers=()
command -v dpkg-source >/dev/null || helpers+=(dpkg-dev libdpkg-perl)
command -v patch >/dev/null || helpers+=(patch)
(cd "$WORK/debs" && apt-get "${APT[@]}" download -qq "$GO_PKG-go" "$GO_PKG-src" rsync libpopt0 \
  golang-github-modern-go-reflect2-dev "${helpers[@]}") || die "apt-get download of the Go toolchain failed"
for deb in "$WORK"/debs/*.deb; do dpkg -x "$deb" "$WORK/tc"; done

dsc=$(ls "$WORK"/src/kubernetes_*.dsc)
PATH="$PATH:$WORK/tc/usr/bin" PERL5LIB="$WORK/tc/usr/share/perl5" \
  dpkg-source --no-check -x "$dsc" "$WORK/src/kubernetes" >/dev/null || die "dpkg-source -x $dsc failed"
SRC="$WORK/src/kubernetes"
GOROOT="$WORK/tc/usr/lib/go-${GO_PKG#golang-}"
[ -x "$GOROOT/bin/go" ] || die "no go binary in the unpacked $GO_PKG-go ($GOROOT/bin/go)"

reflect2="$WORK/tc/usr/share/gocode/src/github.com/modern-go/reflect2"
[ -d "$reflect2" ] || die "golang-github-modern-go-reflect2-dev has no sources at $reflect2"
vend="$SRC/vendor/github.com/modern-go/reflect2"
[ -d "$vend" ] || die "the kubernetes source has no vendored reflect2 at $vend"
rm -f "$vend"/*.go "$vend"/*.s
cp "$reflect2"/*.go "$vend"/
cp "$reflect2"/*.s "$vend"/ 2>/dev/null || true
rm -f "$vend"/*_test.go

mkdir -p "$SRC/.go/src/k8s.io" "$WORK/gocache" "$WORK/home"
ln -sfn "$SRC" "$SRC/.go/src/k8s.io/kubernetes"
say "building ${WHAT[*]} (about 10-20 minutes on 2 cores)"
(
  cd "$SRC/.go/src/k8s.io/kubernetes"
  export GOROOT GOPATH="$SRC/.go" GOCACHE="$WORK/gocache" HOME="$WORK/home"
  export PATH="$GOROOT/bin:$WORK/tc/usr/bin:$PATH" LD_LIBRARY_PATH="$WORK/tc/usr/lib/x86_64-linux-gnu"
  export CGO_ENABLED=0 GOPROXY=off GOFLAGS=-p=2
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" KUBE_BUILD_PLATFORMS=linux/amd64
) >"$LOG" 2>&1 || { tail -40 "$LOG" >&2; die "make failed (full log: $LOG)"; }

mkdir -p "$TMP/bin"
for b in "${WHAT[@]}"; do
  f=$(find "$SRC/_output" -type f -name "$b" | head -1)
  [ -n "$f" ] || die "$b was not produced by the build (log: $LOG)"
  cp "$f" "$TMP/bin/$b"
done
"$TMP/bin/kube-apiserver" --version >&2 || die "the built kube-apiserver does not run"
rm -rf "$WORK"
tf_publish "$TMP" "$OUT"
say "built in $(( $(date +%s) - start ))s into $BIN"
echo "$BIN"
