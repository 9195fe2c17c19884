"""A tiny dynamic provisioner for the local cluster: hostPath volumes in a directory of ours.

It serves one StorageClass (``eop-hostpath``, provisioner ``eop.dev/hostpath``, the cluster's
default class, binding mode ``WaitForFirstConsumer``; :mod:`devenv.cluster` creates it). For
every pending claim of that class that the scheduler has given our node (the annotation
``volume.kubernetes.io/selected-node``) it makes a directory
``<root>/<namespace>.<claim>.<uid8>`` (mode 0777: pods run as any uid, and hostPath volumes get
no fsGroup ownership change) and a PersistentVolume pre-bound to the claim (``claimRef`` with
the claim's uid) with node affinity to the one node; the PV controller then binds the claim,
and the scheduler, waiting for that in its binding cycle, binds the pod. A released volume of
ours whose reclaim policy is ``Delete`` loses its directory and its PV object.

On the multi-node cluster it serves every node, each with a directory of its own
(``--node node1=DIR1 --node node2=DIR2``): a volume is made on the node the scheduler picked
and bound to it by node affinity, so a pod using it can only run there (a lost node's volumes
are lost with it).

It reacts to watch events on claims and volumes and re-lists every ``--resync`` seconds, so a
missed event only delays a claim. Run by ``python -m devenv.cluster up``; by hand::

    python -m devenv.hostpath_provisioner --kubeconfig K --root DIR --node 127.0.0.1
    python -m devenv.hostpath_provisioner --kubeconfig K --node node1=DIR1 --node node2=DIR2
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["PROVISIONER", "STORAGE_CLASS", "HostPathProvisioner", "main"]

#: The StorageClass this provisioner serves, and its ``provisioner`` name.
STORAGE_CLASS = "eop-hostpath"
PROVISIONER = "eop.dev/hostpath"

_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
#: Set on a claim by the scheduler when it has chosen the node of the claim's first pod.
SELECTED_NODE = "volume.kubernetes.io/selected-node"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
_PATH_ANNOTATION = "eop.dev/hostpath"

log = logging.getLogger("hostpath-provisioner")


def storage_class_manifest(name: str = STORAGE_CLASS) -> dict[str, Any]:
    """The default StorageClass served by this provisioner."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": name,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        # Not Immediate: then a pod created right after its claim (a StatefulSet's driver)
        # meets the scheduler before the claim is bound; the scheduler rejects and parks it,
        # and the claim's binding sometimes failed to wake it, leaving it for the periodic
        # flush of unschedulable pods (5 min; docs/local-cluster.md). With WaitForFirstConsumer
        # an unbound claim is the scheduler's own work: it picks the node, annotates the claim
        # (SELECTED_NODE) and waits in its binding cycle (polling every second) until we have
        # bound it.
        "volumeBindingMode": WAIT_FOR_FIRST_CONSUMER,
    }


class HostPathProvisioner:
    """Binds pending claims of ``storage_class`` to new hostPath PVs under the directory of
    the node the scheduler picked."""

    def __init__(
        self,
        core: Any,
        storage: Any,
        roots: Mapping[str, Path],
        storage_class: str = STORAGE_CLASS,
    ) -> None:
        """``core``/``storage``: ``kubernetes.client.CoreV1Api`` / ``StorageV1Api``;
        ``roots``: node name -> the directory of its volumes."""
        self.core = core
        self.storage = storage
        self.roots = {node: root.resolve() for node, root in roots.items()}
        self.storage_class = storage_class

    # ------------------------------------------------------------------ reconcile

    def reconcile(self) -> None:
        """One pass: provision pending claims, delete released volumes. Never raises."""
        try:
            self._reconcile()
        except Exception:
            log.exception("reconcile failed; retrying on the next event or resync")

    def _reconcile(self) -> None:
        cls = self.storage.read_storage_class(self.storage_class)
        reclaim = cls.reclaim_policy or "Delete"
        wait_for_node = cls.volume_binding_mode == WAIT_FOR_FIRST_CONSUMER
        volumes = self.core.list_persistent_volume().items
        claimed = {
            pv.spec.claim_ref.uid
            for pv in volumes
            if pv.spec.claim_ref is not None and pv.spec.claim_ref.uid
        }
        for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if (
                pvc.spec.storage_class_name == self.storage_class
                and not pvc.spec.volume_name
                and (pvc.status.phase or "Pending") == "Pending"
                and pvc.metadata.deletion_timestamp is None
                and pvc.metadata.uid not in claimed
                and (not wait_for_node or self._selected_here(pvc))
            ):
                self._provision(pvc, reclaim)
        for pv in volumes:
            annotations = pv.metadata.annotations or {}
            if (
                annotations.get(_PROVISIONED_BY) == PROVISIONER
                and pv.status.phase in ("Released", "Failed")
                and pv.spec.persistent_volume_reclaim_policy == "Delete"
            ):
                self._delete(pv)

    def _selected_here(self, pvc: Any) -> bool:
        """Whether the scheduler has put the claim's first pod on one of our nodes."""
        node = (pvc.metadata.annotations or {}).get(SELECTED_NODE)
        if node is not None and node not in self.roots:
            log.warning("%s/%s: selected node %s is not ours", pvc.metadata.namespace,
                        pvc.metadata.name, node)  # fmt: skip
        return node in self.roots

    def _provision(self, pvc: Any, reclaim: str) -> None:
        from kubernetes.client.exceptions import ApiException

        ns, name, uid = pvc.metadata.namespace, pvc.metadata.name, pvc.metadata.uid
        if (pvc.spec.volume_mode or "Filesystem") != "Filesystem":
            log.warning("%s/%s: volumeMode %s is not supported", ns, name, pvc.spec.volume_mode)
            return
        # The scheduler's pick (WaitForFirstConsumer), else (Immediate) the only node there is.
        node = (pvc.metadata.annotations or {}).get(SELECTED_NODE) or next(iter(self.roots))
        path = self.roots[node] / f"{ns}.{name}.{uid[:8]}"
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        size = ((pvc.spec.resources.requests or {}) if pvc.spec.resources else {}).get(
            "storage", "1Gi"
        )
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": f"pvc-{uid}",
                "annotations": {_PROVISIONED_BY: PROVISIONER, _PATH_ANNOTATION: str(path)},
            },
            "spec": {
                "capacity": {"storage": size},
                "accessModes": list(pvc.spec.access_modes or ["ReadWriteOnce"]),
                "volumeMode": "Filesystem",
                "persistentVolumeReclaimPolicy": reclaim,
                "storageClassName": self.storage_class,
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": ns,
                    "name": name,
                    "uid": uid,
                },
                "hostPath": {"path": str(path), "type": "Directory"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [node],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
        try:
            self.core.create_persistent_volume(pv)
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier pass
                raise
        log.info("provisioned pvc-%s for %s/%s at %s (%s)", uid, ns, name, path, size)

    def _delete(self, pv: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        path = Path((pv.metadata.annotations or {}).get(_PATH_ANNOTATION, ""))
        ours = set(self.roots.values())
        if path.is_absolute() and path.resolve().parent in ours and path.exists():
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(pv.metadata.name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.info("deleted %s and %s", pv.metadata.name, path)

    # ------------------------------------------------------------------ loop

    def run(self, stop: threading.Event, resync: float = 15.0) -> None:
        """Reconcile on every watch event of claims or volumes, and every ``resync`` s."""
        from kubernetes import watch

        wake = threading.Event()

        def wake_on_stop() -> None:
            stop.wait()
            wake.set()

        threading.Thread(target=wake_on_stop, daemon=True).start()

        def watcher(list_fn: Callable[..., Any]) -> None:
            while not stop.is_set():
                try:
                    stream = watch.Watch().stream  # type: ignore[no-untyped-call]
                    for _ in stream(list_fn, timeout_seconds=60):  # type: ignore[no-untyped-call]
                        wake.set()
                        if stop.is_set():
                            return
                except Exception as exc:
                    log.debug("watch ended: %s", exc)
                    stop.wait(1.0)

        for fn in (
            self.core.list_persistent_volume_claim_for_all_namespaces,
            self.core.list_persistent_volume,
        ):
            threading.Thread(target=watcher, args=(fn,), daemon=True).start()
        while not stop.is_set():
            wake.clear()
            self.reconcile()
            wake.wait(resync)
            # Let a burst of events (claim created, then annotated) settle into one pass.
            time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m devenv.hostpath_provisioner")
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--root", type=Path, help="directory of the volumes of --node NAME")
    parser.add_argument(
        "--node",
        required=True,
        action="append",
        help="a node served: NAME (volumes in --root) or NAME=DIR; repeat for several",
    )
    parser.add_argument("--storage-class", default=STORAGE_CLASS)
    parser.add_argument("--resync", type=float, default=15.0, help="seconds between re-lists")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    from kubernetes import client, config

    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(args.kubeconfig)
    )
    roots: dict[str, Path] = {}
    for spec in args.node:
        name, _, root = spec.partition("=")
        if not root and args.root is None:
            parser.error(f"--node {name}: give its directory (--node {name}=DIR or --root DIR)")
        roots[name] = Path(root) if root else args.root
    provisioner = HostPathProvisioner(
        client.CoreV1Api(api), client.StorageV1Api(api), roots, args.storage_class
    )
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("serving StorageClass %s: volumes in %s", args.storage_class, roots)
    provisioner.run(stop, args.resync)
    return 0


if __name__ == "__main__":
    sys.exit(main())
