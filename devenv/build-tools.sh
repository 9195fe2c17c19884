#!/usr/bin/env bash
# Build the ecosystem tools the tests run, from Go modules.
#
# Usage: devenv/build-tools.sh [TOOL...]
#   TOOL: kstatus-check promql-check promtool lua5.4 seaweedfs (default: all five).
#
#   kstatus-check  devenv/tools/kstatus-check: an object's status by sigs.k8s.io/cli-utils kstatus
#   promql-check   devenv/tools/promql-check: PromQL parsed by Prometheus's parser, metric names
#   promtool       Prometheus's promtool (`promtool test rules`)
#   lua5.4         Debian's Lua interpreter (runs the Argo CD health check), apt-get as root
#   seaweedfs      SeaweedFS's `weed` (an S3-compatible object store, devenv/s3.py), built in a
#                  copy of its module so that its own go.sum and replace directives hold
#
# Versions come only from devenv/versions.env. Binaries land in
#   ${EOP_CACHE:-$HOME/.cache/eop}/<tool>/<version>/bin/<tool>   (seaweedfs: bin/weed)
# A binary that is already present is skipped, so a re-run is a no-op.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"

cache="${EOP_CACHE:-$HOME/.cache/eop}"
cli_utils_v="${CLI_UTILS_VERSION:?CLI_UTILS_VERSION missing in versions.env}"
prom_v="${PROMETHEUS_MODULE_VERSION:?PROMETHEUS_MODULE_VERSION missing in versions.env}"
seaweedfs_v="${SEAWEEDFS_MODULE_VERSION:?SEAWEEDFS_MODULE_VERSION missing in versions.env}"
all_tools=(kstatus-check promql-check promtool lua5.4 seaweedfs)

# shellcheck source-path=SCRIPTDIR source=go-build.env
source "$here/go-build.env"

log() { printf '[build-tools] %s\n' "$*" >&2; }
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

wanted=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        kstatus-check | promql-check | promtool | lua5.4 | seaweedfs) wanted+=("$arg") ;;
        *) log "unknown tool: $arg"; usage >&2; exit 2 ;;
    esac
done
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${all_tools[@]}")

# version TOOL: the pinned version of the module the tool is built from.
version() {
    case "$1" in
        kstatus-check) echo "$cli_utils_v" ;;
        seaweedfs) echo "$seaweedfs_v" ;;
        *) echo "$prom_v" ;;
    esac
}

# binary TOOL: the file name of the tool's binary.
binary() {
    case "$1" in
        seaweedfs) echo weed ;;
        *) echo "$1" ;;
    esac
}

# build_checker TOOL MODULE VERSION OUT: build devenv/tools/TOOL against MODULE@VERSION
# (go.mod and go.sum of the source are the starting point; versions.env wins).
build_checker() {
    local tool="$1" module="$2" ver="$3" out="$4"
    local src="$cache/$tool/$ver/src"
    rm -rf "$src"
    mkdir -p "$src"
    cp "$here/tools/$tool/main.go" "$here/tools/$tool/go.mod" "$here/tools/$tool/go.sum" "$src/"
    (cd "$src" && go mod edit -require="$module@v$ver" && go mod tidy)
    (cd "$src" && go build -trimpath -ldflags="-s -w" -o "$out.tmp.$$" .)
    mv -f "$out.tmp.$$" "$out"
}

# build_promtool VERSION OUT: Prometheus's cmd/promtool inside a throwaway module.
build_promtool() {
    local ver="$1" out="$2" mod="$cache/promtool/$1/gomod"
    mkdir -p "$mod"
    if [[ ! -f "$mod/go.mod" ]]; then
        printf 'module eop.local/promtoolbuild\n\ngo 1.26.7\n\nrequire github.com/prometheus/prometheus v%s\n' \
            "$ver" >"$mod/go.mod"
    fi
    # Module v0.MMM.P is Prometheus release (MMM / 100).(MMM % 100).P, e.g. v0.316.0 is 3.16.0.
    local mmm="${ver#0.}"
    mmm="${mmm%%.*}"
    local release="$((mmm / 100)).$((mmm % 100)).${ver##*.}"
    # remove_all_sd: no service-discovery plugins (cloud SDKs); `promtool test rules` needs none.
    (cd "$mod" && go build -trimpath -tags remove_all_sd \
        -ldflags="-s -w -X github.com/prometheus/common/version.Version=$release" \
        -o "$out.tmp.$$" github.com/prometheus/prometheus/cmd/promtool)
    mv -f "$out.tmp.$$" "$out"
}

# build_seaweedfs VERSION OUT: `weed` from github.com/seaweedfs/seaweedfs@vVERSION. Built inside a
# writable copy of the module (not as a dependency of a throwaway module, where its go.mod's
# replace directives would not apply), with its own go.sum checking every dependency.
build_seaweedfs() {
    local ver="$1" out="$2" module=github.com/seaweedfs/seaweedfs src
    src="$(go mod download -json "$module@v$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "$src" && -d "$src/weed" ]] || { log "error: go mod download $module@v$ver gave no source"; exit 1; }
    local work="$cache/seaweedfs/$ver/src"
    rm -rf "$work"
    mkdir -p "$work"
    cp -R "$src/." "$work/"
    chmod -R u+w "$work"
    (cd "$work" && go build -trimpath -ldflags="-s -w" -o "$out.tmp.$$" ./weed)
    mv -f "$out.tmp.$$" "$out"
    rm -rf "$work"
}

# ensure_lua: Debian's lua5.4 package (the interpreter Argo CD's health scripts are tested with).
ensure_lua() {
    if command -v lua5.4 >/dev/null; then
        log "up to date: lua5.4"
        return
    fi
    [[ $EUID -eq 0 ]] || { log "error: needs root to apt-get install lua5.4"; exit 1; }
    log "installing lua5.4"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq lua5.4 >/dev/null
    built=$((built + 1))
}

built=0
declare -A seen=()
for tool in "${wanted[@]}"; do
    [[ -z "${seen[$tool]:-}" ]] || continue
    seen[$tool]=1
    if [[ "$tool" == lua5.4 ]]; then
        ensure_lua
        continue
    fi
    ver="$(version "$tool")"
    out="$cache/$tool/$ver/bin/$(binary "$tool")"
    if [[ -x "$out" ]]; then
        log "up to date: $tool v$ver"
        continue
    fi
    mkdir -p "$(dirname "$out")"
    log "building $tool v$ver ..."
    start=$SECONDS
    case "$tool" in
        kstatus-check) build_checker "$tool" sigs.k8s.io/cli-utils "$ver" "$out" ;;
        promql-check) build_checker "$tool" github.com/prometheus/prometheus "$ver" "$out" ;;
        promtool) build_promtool "$ver" "$out" ;;
        seaweedfs) build_seaweedfs "$ver" "$out" ;;
    esac
    log "built $tool v$ver in $((SECONDS - start))s -> $out"
    built=$((built + 1))
done
[[ $built -gt 0 ]] || log "nothing to build (cache: $cache)"
