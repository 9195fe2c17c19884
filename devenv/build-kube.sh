#!/usr/bin/env bash
# Build a real Kubernetes control plane (plus etcd, helm and CoreDNS) from Go modules.
#
# Usage: devenv/build-kube.sh [COMPONENT...]
#   COMPONENT: kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#              kubectl etcd helm coredns, or the groups "kube" (the six kube binaries),
#              "cluster" (what the one-node local cluster and its chart need: no kube-proxy,
#              no CoreDNS, which only the multi-node cluster runs) and "all" (default).
#
# Versions come only from devenv/versions.env. Binaries land in
#   ${EOP_CACHE:-$HOME/.cache/eop}/kube/<KUBERNETES_VERSION>/bin/
#   ${EOP_CACHE:-$HOME/.cache/eop}/etcd/<ETCD_VERSION>/bin/etcd
#   ${EOP_CACHE:-$HOME/.cache/eop}/helm/<HELM_VERSION>/bin/helm
#   ${EOP_CACHE:-$HOME/.cache/eop}/coredns/<COREDNS_VERSION>/bin/coredns
# A binary that is already present is skipped, so a re-run is a no-op.
#
# Each component is built inside a throwaway Go module (under the cache dir) that
# requires the upstream module. k8s.io/kubernetes requires its staging modules at
# v0.0.0 and replaces them with ./staging paths, which only works inside its own
# repository; here every such module is pinned to the published v0.<minor>.<patch>.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"

cache="${EOP_CACHE:-$HOME/.cache/eop}"
kube_v="${KUBERNETES_VERSION:?KUBERNETES_VERSION missing in versions.env}"
etcd_v="${ETCD_VERSION:?ETCD_VERSION missing in versions.env}"
helm_v="${HELM_VERSION:?HELM_VERSION missing in versions.env}"
coredns_v="${COREDNS_VERSION:?COREDNS_VERSION missing in versions.env}"
helm_major="${helm_v%%.*}"

kube_bin="$cache/kube/$kube_v/bin"
etcd_bin="$cache/etcd/$etcd_v/bin"
helm_bin="$cache/helm/$helm_v/bin"
coredns_bin="$cache/coredns/$coredns_v/bin"

kube_components=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
cluster_components=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd helm)
all_components=("${kube_components[@]}" etcd helm coredns)

# shellcheck source-path=SCRIPTDIR source=go-build.env
source "$here/go-build.env"

log() { printf '[build-kube] %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# --- argument parsing -------------------------------------------------------
wanted=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        all) wanted+=("${all_components[@]}") ;;
        kube) wanted+=("${kube_components[@]}") ;;
        cluster) wanted+=("${cluster_components[@]}") ;;
        kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy | kubectl | \
            etcd | helm | coredns)
            wanted+=("$arg") ;;
        *) log "unknown component: $arg"; usage >&2; exit 2 ;;
    esac
done
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${all_components[@]}")

# --- helpers ----------------------------------------------------------------

# module_info MODULE VERSION FIELD: a field (Time, GoMod, ...) of `go list -m -json`.
module_field() {
    (cd "$2" && go list -m -json "$1" | sed -n "s/^[[:space:]]*\"$3\": \"\(.*\)\",\{0,1\}$/\1/p" | head -n1)
}

# go_build MODDIR PACKAGE OUTPUT LDFLAGS: build one main package atomically.
go_build() {
    local moddir="$1" pkg="$2" out="$3" ldflags="$4"
    local tmp="$out.tmp.$$"
    mkdir -p "$(dirname "$out")"
    (cd "$moddir" && go build -trimpath -ldflags="-s -w $ldflags" -o "$tmp" "$pkg")
    mv -f "$tmp" "$out"
}

# throwaway_module DIR NAME MODULE VERSION: a Go module in DIR (created once, then kept with the
# go.sum its builds add) that requires MODULE at vVERSION, to build MODULE's commands inside.
throwaway_module() {
    local dir="$1" name="$2" module="$3" version="$4"
    mkdir -p "$dir"
    if [[ ! -f "$dir/go.mod" ]]; then
        printf 'module eop.local/%s\n\ngo 1.26.0\n\nrequire %s v%s\n' \
            "$name" "$module" "$version" >"$dir/go.mod"
    fi
}

# --- kubernetes -------------------------------------------------------------
kube_mod=""
kube_ldflags=""
prepare_kube() {
    [[ -z "$kube_mod" ]] || return 0
    kube_mod="$cache/kube/$kube_v/gomod"
    mkdir -p "$kube_mod"
    local gomod
    gomod="$(cd "$kube_mod" && GOFLAGS='' go mod download -json "k8s.io/kubernetes@v$kube_v" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$gomod" ]] || { log "cannot fetch go.mod of k8s.io/kubernetes@v$kube_v"; exit 1; }

    local minor_patch="${kube_v#*.}" staging_v
    staging_v="v0.$minor_patch"
    # Staging modules: replaced with a ./staging path AND required (at v0.0.0).
    local replaced required staging
    replaced="$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod" | sort -u)"
    required="$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }
                     $1 == "require" && $2 ~ /^k8s\.io\// && $3 == "v0.0.0" { print $2 }' "$gomod" | sort -u)"
    staging="$(comm -12 <(printf '%s\n' "$replaced") <(printf '%s\n' "$required"))"
    [[ -n "$staging" ]] || { log "found no staging modules in $gomod"; exit 1; }

    local go_line godebug
    go_line="$(awk '$1 == "go" { print; exit }' "$gomod")"
    godebug="$(awk '$1 == "godebug" { print }' "$gomod")"
    {
        echo "// Generated by devenv/build-kube.sh; throwaway module to build k8s.io/kubernetes."
        echo "module eop.local/kubebuild"
        echo
        echo "$go_line"
        [[ -z "$godebug" ]] || echo "$godebug"
        echo
        echo "require k8s.io/kubernetes v$kube_v"
        echo
        echo "replace ("
        local m
        for m in $staging; do echo "	$m => $m $staging_v"; done
        echo ")"
    } >"$kube_mod/go.mod.new"
    if ! cmp -s "$kube_mod/go.mod.new" "$kube_mod/go.mod.src" 2>/dev/null; then
        cp "$kube_mod/go.mod.new" "$kube_mod/go.mod"
        cp "$kube_mod/go.mod.new" "$kube_mod/go.mod.src"
    fi
    rm -f "$kube_mod/go.mod.new"

    local build_date major minor
    build_date="$(module_field "k8s.io/kubernetes" "$kube_mod" Time)"
    build_date="${build_date%%.*}"
    [[ "$build_date" == *Z ]] || build_date="${build_date}Z"
    major="${kube_v%%.*}"
    minor="${minor_patch%%.*}"
    local pkg flags=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=v$kube_v"
        flags+=" -X $pkg.gitMajor=$major"
        flags+=" -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitCommit=v$kube_v"
        flags+=" -X $pkg.gitTreeState=clean"
        flags+=" -X $pkg.buildDate=$build_date"
    done
    kube_ldflags="$flags"
}

# build_kube NAME...: build these Kubernetes commands in one `go build`, so that their links
# (each a single-threaded minute on 2 busy cores) and the compiles they do not share run side by
# side; each binary is moved into place only once all are built.
build_kube() {
    prepare_kube
    local tmp="$kube_bin/.build.$$" pkgs=() name
    for name in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
    rm -rf "$tmp"
    mkdir -p "$tmp"
    (cd "$kube_mod" && go build -trimpath -ldflags="-s -w $kube_ldflags" -o "$tmp/" "${pkgs[@]}")
    for name in "$@"; do mv -f "$tmp/$name" "$kube_bin/$name"; done
    rmdir "$tmp"
}

# --- etcd -------------------------------------------------------------------
build_etcd() {
    local mod="$cache/etcd/$etcd_v/gomod"
    throwaway_module "$mod" etcdbuild go.etcd.io/etcd/server/v3 "$etcd_v"
    # The etcd server main package is the root of the go.etcd.io/etcd/server/v3 module.
    go_build "$mod" "go.etcd.io/etcd/server/v3" "$etcd_bin/etcd" \
        "-X go.etcd.io/etcd/api/v3/version.GitSHA=v$etcd_v"
}

# --- helm -------------------------------------------------------------------
build_helm() {
    local mod="$cache/helm/$helm_v/gomod" path="helm.sh/helm/v$helm_major"
    throwaway_module "$mod" helmbuild "$path" "$helm_v"
    go_build "$mod" "$path/cmd/helm" "$helm_bin/helm" \
        "-X $path/internal/version.version=v$helm_v -X $path/internal/version.gitTreeState=clean"
}

# --- coredns ----------------------------------------------------------------
build_coredns() {
    local mod="$cache/coredns/$coredns_v/gomod" path="github.com/coredns/coredns"
    throwaway_module "$mod" corednsbuild "$path" "$coredns_v"
    # The main package is the module's root; the plugins compiled in are the upstream default
    # set (core/plugin/zplugin.go, generated from plugin.cfg and part of the module).
    go_build "$mod" "$path" "$coredns_bin/coredns" "-X $path/coremain.GitCommit=v$coredns_v"
}

# --- main -------------------------------------------------------------------
# build_one COMPONENT: build etcd, helm or CoreDNS unless its binary is there.
build_one() {
    local c="$1" out ver start
    case "$c" in
        etcd) out="$etcd_bin/etcd"; ver="$etcd_v" ;;
        helm) out="$helm_bin/helm"; ver="$helm_v" ;;
        coredns) out="$coredns_bin/coredns"; ver="$coredns_v" ;;
    esac
    if [[ -x "$out" ]]; then
        log "up to date: $c"
        return 0
    fi
    log "building $c v$ver ..."
    start="$(now)"
    case "$c" in
        etcd) build_etcd ;;
        helm) build_helm ;;
        coredns) build_coredns ;;
    esac
    log "built $c v$ver in $(elapsed "$start")s -> $out"
}

# build_kube_missing NAME...: build those of these Kubernetes commands whose binary is not there.
build_kube_missing() {
    local missing=() c start
    for c in "$@"; do
        if [[ -x "$kube_bin/$c" ]]; then log "up to date: $c"; else missing+=("$c"); fi
    done
    [[ ${#missing[@]} -gt 0 ]] || return 0
    log "building ${missing[*]} v$kube_v ..."
    start="$(now)"
    build_kube "${missing[@]}"
    log "built ${missing[*]} v$kube_v in $(elapsed "$start")s -> $kube_bin"
}

# etcd, helm and CoreDNS are modules of their own: each builds in the background beside the
# Kubernetes binaries (one module, built in one `go build`), so that their module downloads
# overlap the compiling that takes the cores.
total_start="$(now)"
declare -A seen=()
background=()
kube_wanted=()
trap 'kill "${background[@]}" 2>/dev/null || true' EXIT
for c in "${wanted[@]}"; do
    [[ -z "${seen[$c]:-}" ]] || continue
    seen[$c]=1
    case "$c" in
        etcd | helm | coredns) build_one "$c" & background+=($!) ;;
        *) kube_wanted+=("$c") ;;
    esac
done
[[ ${#kube_wanted[@]} -eq 0 ]] || build_kube_missing "${kube_wanted[@]}"
failed=0
for pid in "${background[@]}"; do wait "$pid" || failed=1; done
background=()
[[ $failed -eq 0 ]] || { log "a build failed (see above)"; exit 1; }
log "done in $(elapsed "$total_start")s (cache: $cache)"
