"""Small images of the local cluster, made here without a registry or an image builder.

Each is one static binary (plus, for the toolbox, its applet links) packed by Python into a
one-layer OCI archive (what ``ctr images import`` reads), cached under ``~/.cache/eop``:

* :func:`build_pause_image`: ``localhost/eop-pause:<hash>``, the pod sandbox (a ~20-line Go
  program built static), every node's ``sandbox_image``;
* :func:`build_coredns_image`: ``localhost/eop-coredns:<COREDNS_VERSION>``, CoreDNS built from
  its Go module by ``devenv/build-kube.sh coredns``; the multi-node cluster's DNS;
* :func:`build_toolbox_image`: ``localhost/eop-toolbox:<hash>``, Debian's static busybox (``sh``,
  ``nc``, ``wget``, ``httpd``, ``nslookup``...), for test pods on the pod network.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from devenv.kube import BUILD_SCRIPT
from devenv.versions import cache_root, versions

__all__ = [
    "ImageError",
    "build_coredns_image",
    "build_pause_image",
    "build_toolbox_image",
    "oci_archive",
]

_PAUSE_GO = """\
// The pod sandbox process: sleeps until SIGTERM/SIGINT and reaps zombies (it is PID 1 of
// pods that share their PID namespace). Built static; the only file of localhost/eop-pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
"""

#: Debian's statically linked busybox (package ``busybox-static``).
_BUSYBOX = Path("/bin/busybox")


class ImageError(RuntimeError):
    """An image's binary could not be built or found."""


def oci_archive(
    out: Path,
    ref: str,
    files: Mapping[str, bytes],
    entrypoint: Sequence[str],
    *,
    symlinks: Mapping[str, str] | None = None,
    dirs: Mapping[str, int] | None = None,
    user: str = "65535:65535",
) -> None:
    """Write a one-layer OCI image archive (what ``ctr images import`` reads).

    ``files`` are executables (mode 0755) by path in the image, ``symlinks`` link name ->
    target, ``dirs`` directories by path -> mode; ``user`` the image's user.
    """
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode in (dirs or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
            tar.addfile(info)
    layer = layer_buf.getvalue()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer)}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": list(entrypoint), "User": user},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    }
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **blob(json.dumps(config, sort_keys=True).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **blob(json.dumps(manifest, sort_keys=True).encode()),
        "annotations": {
            "io.containerd.image.name": ref,
            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
        },
    }
    index = {"schemaVersion": 2, "manifests": [manifest_desc]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w") as arc:
        entries = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index).encode(),
            **{f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()},
        }
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            arc.addfile(info, io.BytesIO(data))
    tmp.replace(out)


def build_pause_image(cache: Path | None = None) -> tuple[str, Path]:
    """Build (cached) the sandbox image: a static Go ``/pause``. Returns (ref, archive)."""
    root = (cache or cache_root()) / "pause"
    tag = hashlib.sha256(_PAUSE_GO.encode()).hexdigest()[:12]
    ref = f"localhost/eop-pause:{tag}"
    archive = root / f"eop-pause-{tag}.tar"
    if archive.exists():
        return ref, archive
    go = shutil.which("go") or "/usr/local/go/bin/go"
    build = root / "src"
    build.mkdir(parents=True, exist_ok=True)
    (build / "pause.go").write_text(_PAUSE_GO)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "", "GO111MODULE": "off"}
    result = subprocess.run(
        [go, "build", "-trimpath", "-ldflags=-s -w", "-o", "pause", "pause.go"],
        cwd=build,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"building the pause binary failed:\n{result.stdout}{result.stderr}")
    oci_archive(archive, ref, {"pause": (build / "pause").read_bytes()}, ["/pause"])
    return ref, archive


def coredns_binary(cache: Path | None = None) -> Path:
    """Where ``devenv/build-kube.sh coredns`` puts the CoreDNS binary."""
    return (cache or cache_root()) / "coredns" / versions()["COREDNS_VERSION"] / "bin" / "coredns"


def build_coredns_image(cache: Path | None = None) -> tuple[str, Path]:
    """Build (cached) ``localhost/eop-coredns:<version>``: ``/coredns``, user 65532.

    Runs ``devenv/build-kube.sh coredns`` (a no-op when the binary is cached).
    """
    version = versions()["COREDNS_VERSION"]
    ref = f"localhost/eop-coredns:{version}"
    archive = (cache or cache_root()) / "coredns" / version / f"eop-coredns-{version}.tar"
    if archive.exists():
        return ref, archive
    binary = coredns_binary(cache)
    if not binary.exists():
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "coredns"], capture_output=True, text=True, check=False
        )
        if result.returncode != 0 or not binary.exists():
            raise ImageError(f"building CoreDNS failed:\n{result.stdout}{result.stderr[-4000:]}")
    oci_archive(archive, ref, {"coredns": binary.read_bytes()}, ["/coredns"], user="65532:65532")
    return ref, archive


def build_toolbox_image(cache: Path | None = None) -> tuple[str, Path]:
    """Build (cached) ``localhost/eop-toolbox:<hash>``: Debian's static busybox and its applets
    as ``/bin/<applet>`` links (``sh``, ``nc``, ``wget``, ``httpd``, ``nslookup``...), ``/tmp``;
    user 65534. The tag is a hash of the binary. Needs the package ``busybox-static``.
    """
    if not _BUSYBOX.exists():
        raise ImageError(f"{_BUSYBOX} is missing: apt-get install busybox-static")
    data = _BUSYBOX.read_bytes()
    tag = hashlib.sha256(data).hexdigest()[:12]
    ref = f"localhost/eop-toolbox:{tag}"
    archive = (cache or cache_root()) / "toolbox" / f"eop-toolbox-{tag}.tar"
    if archive.exists():
        return ref, archive
    applets = subprocess.run(
        [str(_BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    links = {f"bin/{a}": "busybox" for a in applets if a != "busybox" and "/" not in a}
    oci_archive(
        archive,
        ref,
        {"bin/busybox": data},
        ["/bin/sh"],
        symlinks=links,
        dirs={"bin": 0o755, "tmp": 0o1777},
        user="65534:65534",
    )
    return ref, archive
