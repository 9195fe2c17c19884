#!/usr/bin/env bash
# Build the eop container images without a Docker engine: buildah, on a debootstrapped base.
#
# Usage: devenv/images.sh [base|operator|spark|all|tag]   (default: all)
#   base       localhost/debian-base:bookworm, made with debootstrap from the host's apt mirror
#   operator   localhost/eop-operator:<tag>   (Dockerfile target "operator")
#   spark      localhost/eop-spark:<tag>      (Dockerfile target "spark")
#   all        base, operator and spark
#   tag        print the tag only: a content hash of everything the images are built from
#
# Each image is also exported to ${EOP_CACHE:-~/.cache/eop}/images/eop-<name>-<tag>.tar
# (oci-archive, for `ctr -n k8s.io images import`). Prints the image refs, one a line.
# Idempotent: the base is rebuilt only when its recipe changes, an image only when its tag
# (its inputs) changes; a warm run is a no-op.
#
# Environment:
#   EOP_BASE_IMAGE      another Debian bookworm base (then no debootstrap is done)
#   EOP_BUILD_CA_FILE   CA bundle handed to the build as the secret "build-ca" for PyPI and
#                       Maven behind a TLS-inspecting proxy (default: the host's bundle;
#                       empty: none). A build secret never lands in an image layer.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${EOP_CACHE:-$HOME/.cache/eop}"
images_dir="$cache/images"

local_base=localhost/debian-base:bookworm
base_image="${EOP_BASE_IMAGE:-$local_base}"
suite=bookworm
build_ca="${EOP_BUILD_CA_FILE-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"

# What the image tag hashes: every input of the Dockerfile's COPY steps plus the recipe itself.
tag_inputs=(Dockerfile .dockerignore pyproject.toml README.md operator spark_apps devenv/fetch-jars.sh devenv/versions.env)

log() { printf '[images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# --- tools --------------------------------------------------------------------------------------

ensure_tools() {
    local pkg missing=()
    for pkg in buildah debootstrap containerd runc; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    [[ ${#missing[@]} -eq 0 ]] && return
    [[ $EUID -eq 0 ]] || die "needs root to apt-get install ${missing[*]}"
    log "installing ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
}

image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# --- the host's apt mirror -----------------------------------------------------------------------

# apt_uri SUITE: the first URI the host's apt sources use for SUITE (one-line .list files and
# deb822 .sources files), so the image is built from the same mirror the machine trusts.
apt_uri() {
    local suite="$1" f
    {
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
            [[ -f "$f" ]] || continue
            # deb [options] URI SUITE COMPONENT...
            awk -v s="$suite" '$1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) print $i
            }' "$f"
        done
        for f in /etc/apt/sources.list.d/*.sources; do
            [[ -f "$f" ]] || continue
            # deb822: paragraphs of "Key: value" lines.
            awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^#/) continue
                    key = tolower($i); sub(/:.*/, "", key)
                    value = $i; sub(/^[^:]*:[ \t]*/, "", value)
                    if (key == "types") types = value
                    else if (key == "uris") uris = value
                    else if (key == "suites") suites = value
                    else if (key == "enabled") enabled = tolower(value)
                }
                if (enabled != "no" && (" " types " ") ~ / deb / && (" " suites " ") ~ (" " s " ")) {
                    split(uris, u, /[ \t]+/); print u[1]
                }
            }' "$f"
        done
    } | head -n1
}

# --- base image ----------------------------------------------------------------------------------

build_base() {
    if [[ "$base_image" != "$local_base" ]]; then
        log "using EOP_BASE_IMAGE=$base_image (no debootstrap)"
        return
    fi
    local mirror security recipe stamp="$images_dir/debian-base-$suite.stamp"
    local rootfs_tar="$images_dir/debian-base-$suite.rootfs.tar"
    mirror="$(apt_uri "$suite")"
    [[ -n "$mirror" ]] || die "no apt source for $suite in /etc/apt/sources.list{,.d/}"
    security="$(apt_uri "$suite-security")"
    recipe="debootstrap --variant=minbase $suite $mirror security=$security v1"

    if [[ "$(cat "$stamp" 2>/dev/null)" == "$recipe" ]] && image_exists "$local_base"; then
        log "up to date: $local_base"
        return
    fi
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$recipe" || ! -s "$rootfs_tar" ]]; then
        local start=$SECONDS rootfs="$images_dir/debian-base-$suite.rootfs"
        log "debootstrap $suite from $mirror"
        rm -rf "$rootfs" && mkdir -p "$rootfs"
        debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$images_dir/debootstrap.log" 2>&1 ||
            die "debootstrap failed, see $images_dir/debootstrap.log"
        # Images get updates and security fixes at build time, from the same mirrors as the host.
        {
            echo "deb $mirror $suite main"
            echo "deb $mirror $suite-updates main"
            [[ -z "$security" ]] || echo "deb $security $suite-security main"
        } >"$rootfs/etc/apt/sources.list"
        # Nothing of this host in the image: its resolver, its hostname, downloaded indexes.
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
            "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log
        : >"$rootfs/etc/resolv.conf"
        : >"$rootfs/etc/hostname"
        # /dev, /proc and /sys are provided by the container runtime.
        tar -C "$rootfs" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' \
            --exclude='./sys/*' -cf "$rootfs_tar.partial" .
        mv "$rootfs_tar.partial" "$rootfs_tar"
        rm -rf "$rootfs"
        log "debootstrap done in $((SECONDS - start))s"
    fi
    local c
    c="$(buildah from scratch)"
    buildah add --quiet "$c" "$rootfs_tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd '["bash"]' --label "eop.base.recipe=$recipe" "$c"
    buildah commit --quiet --rm "$c" "$local_base" >/dev/null
    echo "$recipe" >"$stamp"
    log "imported $local_base"
}

# --- eop images ----------------------------------------------------------------------------------

# The tag: a hash of the base image name and of every file the images are built from.
compute_tag() {
    local inputs=() p
    cd "$repo"
    for p in "${tag_inputs[@]}"; do [[ -e "$p" ]] && inputs+=("$p"); done
    {
        echo "base=$base_image"
        find "${inputs[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
            LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-12
}

# build_image NAME TAG: build target NAME as localhost/eop-NAME:TAG and export it to the cache.
build_image() {
    local name="$1" tag="$2" ref archive start
    ref="localhost/eop-$name:$tag"
    archive="$images_dir/eop-$name-$tag.tar"
    if image_exists "$ref" && [[ -s "$archive" ]]; then
        log "up to date: $ref"
        echo "$ref"
        return
    fi
    [[ -f "$repo/README.md" ]] || die "README.md is missing: pyproject.toml names it as the readme"
    local secret=()
    [[ -z "$build_ca" ]] || secret=(--secret "id=build-ca,src=$build_ca")
    start=$SECONDS
    log "building $ref"
    buildah bud --isolation chroot --network host --layers \
        --target "$name" --build-arg "BASE_IMAGE=$base_image" "${secret[@]}" \
        --file "$repo/Dockerfile" --tag "$ref" "$repo" >"$images_dir/build-$name.log" 2>&1 ||
        die "buildah bud failed, see $images_dir/build-$name.log"
    log "built $ref in $((SECONDS - start))s"
    buildah push --quiet "$ref" "oci-archive:$archive.partial:$ref" >/dev/null
    mv "$archive.partial" "$archive"
    # Keep one tag and one archive per image: older ones are superseded (their shared layers stay
    # in buildah's storage as build cache).
    find "$images_dir" -maxdepth 1 -name "eop-$name-*.tar" ! -name "eop-$name-$tag.tar" -delete
    local old
    for old in $(buildah images --noheading --format '{{.Name}}:{{.Tag}}' \
        --filter "reference=localhost/eop-$name"); do
        [[ "$old" == "$ref" ]] || buildah rmi "$old" >/dev/null 2>&1 || true
    done
    log "exported $archive ($(du -h "$archive" | cut -f1))"
    echo "$ref"
}

# --- main ----------------------------------------------------------------------------------------

main() {
    local what="${1:-all}"
    [[ $# -le 1 ]] || { usage >&2; exit 2; }
    case "$what" in
        -h | --help) usage; return ;;
        tag) compute_tag; return ;;
        base | operator | spark | all) ;;
        *) usage >&2; exit 2 ;;
    esac
    ensure_tools
    mkdir -p "$images_dir"
    # One build at a time: buildah's layer cache and the archives are shared.
    exec 9>"$images_dir/.lock"
    flock 9
    # One tag per run, so that both images of an `all` run share it even if files change meanwhile.
    local tag
    tag="$(compute_tag)"
    case "$what" in
        base) build_base; echo "$base_image" ;;
        operator | spark) build_base; build_image "$what" "$tag" ;;
        all) build_base; build_image operator "$tag"; build_image spark "$tag" ;;
    esac
}

main "$@"
