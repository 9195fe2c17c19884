"""A real, local Kubernetes control plane for tests and humans.

Runs etcd, kube-apiserver and kube-controller-manager (optionally kube-scheduler) as
plain processes bound to 127.0.0.1 on free ports, with certificates made by the
``openssl`` CLI. The binaries are built from Go modules by ``devenv/build-kube.sh``
(see :func:`build_binaries`); their versions come from ``devenv/versions.env``.

Typical use::

    with ControlPlane(tmp_path / "kube") as cp:
        cp.kubectl("get", "namespaces", check=True)
        sa_config = cp.service_account_kubeconfig("default", "robot", create=True)

From a shell: ``python -m devenv.kube up --dir /tmp/eop-kube`` (foreground; Ctrl-C stops).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from devenv.processes import (
    Service,
    free_port,
    log_tail,
    serve_until_stopped,
    spawn_logged,
    stop_on_signals,
    terminate,
)
from devenv.versions import cache_root, versions

__all__ = [
    "BUILD_SCRIPT",
    "ControlPlane",
    "ControlPlaneError",
    "KubeBinaries",
    "build_binaries",
    "main",
]

BUILD_SCRIPT = Path(__file__).with_name("build-kube.sh")

#: Only an allocation range for ClusterIPs: nothing listens or routes there.
DEFAULT_SERVICE_CIDR = "10.0.0.0/24"

_LOOPBACK = "127.0.0.1"


#: The apiserver's audit policy with ``audit=True``: completed requests, metadata only.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata"}],
}


def audit_entries(log: Path, offset: int = 0) -> Iterator[dict[str, Any]]:
    """The audit log's entries from byte ``offset`` on (``ControlPlane(audit=True)``)."""
    if not log.exists():
        return
    with log.open() as lines:
        lines.seek(offset)
        for line in lines:
            if line.endswith("\n"):  # the apiserver may be writing the last one
                yield json.loads(line)


class ControlPlaneError(RuntimeError):
    """A control-plane component failed to build, start or answer in time."""


@dataclass(frozen=True)
class KubeBinaries:
    """Paths of the binaries built by ``devenv/build-kube.sh``."""

    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kube_proxy: Path
    kubectl: Path
    etcd: Path
    helm: Path

    @classmethod
    def from_cache(cls, root: Path | None = None) -> KubeBinaries:
        """Binaries for the versions pinned in ``versions.env`` under the cache ``root``."""
        root = cache_root() if root is None else root
        pinned = versions()
        kube = root / "kube" / pinned["KUBERNETES_VERSION"] / "bin"
        return cls(
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubelet=kube / "kubelet",
            kube_proxy=kube / "kube-proxy",
            kubectl=kube / "kubectl",
            etcd=root / "etcd" / pinned["ETCD_VERSION"] / "bin" / "etcd",
            helm=root / "helm" / pinned["HELM_VERSION"] / "bin" / "helm",
        )

    def missing(self, names: Sequence[str] = ()) -> list[Path]:
        """The binaries that do not exist (yet), among ``names`` (fields; default: all)."""
        wanted = [getattr(self, n) for n in names] if names else list(vars(self).values())
        return [p for p in wanted if not os.access(p, os.X_OK)]


def build_binaries(components: Sequence[str] = (), *, quiet: bool = False) -> KubeBinaries:
    """Run ``devenv/build-kube.sh`` (a fast no-op when everything is cached).

    ``components`` are names the script accepts (default: all). With ``quiet`` the
    script's output is captured and only shown in the error when the build fails.
    """
    cmd = ["bash", str(BUILD_SCRIPT), *components]
    if quiet:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ControlPlaneError(
                f"{BUILD_SCRIPT.name} failed ({result.returncode}):\n"
                + _tail_text(result.stdout + result.stderr, 60)
            )
    else:
        code = subprocess.run(cmd, check=False).returncode
        if code != 0:
            raise ControlPlaneError(f"{BUILD_SCRIPT.name} failed ({code})")
    return KubeBinaries.from_cache()


def run_kubectl(
    kubectl: Path,
    kubeconfig: Path | str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    check: bool,
    input: str | None,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    """Run ``kubectl --kubeconfig=KUBECONFIG ARGS``; output captured as text.

    With ``check`` a non-zero exit raises :class:`subprocess.CalledProcessError`.
    """
    return subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        input=input,
        check=check,
        timeout=timeout,
        env=dict(env),
    )


def run_helm(
    helm: Path,
    kubeconfig: Path | str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    helm_home: Path,
    check: bool,
    timeout: float | None,
) -> subprocess.CompletedProcess[str]:
    """Run ``helm --kubeconfig=KUBECONFIG ARGS`` with its cache, config and data dirs under
    ``helm_home``; output captured as text."""
    env = dict(env)
    for kind in ("CACHE", "CONFIG", "DATA"):
        env[f"HELM_{kind}_HOME"] = str(helm_home / kind.lower())
    return subprocess.run(
        [str(helm), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
        env=env,
    )


def _tail_text(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stdout}{result.stderr}")


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    log_file: IO[bytes]


class ControlPlane(Service):
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1, for tests.

    Everything lives in ``work_dir``: ``pki/`` (certificates), ``etcd-data/``,
    ``logs/<component>.log``, ``admin.kubeconfig`` and ``kubeconfigs/``. Certificates
    and etcd data are reused when the directory is started again; ports are new.
    """

    def __init__(
        self,
        work_dir: Path | str,
        *,
        binaries: KubeBinaries | None = None,
        scheduler: bool = False,
        service_cidr: str = DEFAULT_SERVICE_CIDR,
        start_timeout: float = 180.0,
        extra_apiserver_args: Sequence[str] = (),
        extra_controller_manager_args: Sequence[str] = (),
        apiserver_port: int = 0,
        apiserver_bind_address: str = _LOOPBACK,
        advertise_address: str = _LOOPBACK,
        extra_sans: Sequence[str] = (),
        audit: bool = False,
    ) -> None:
        """Configure (but do not start) a control plane in ``work_dir``.

        ``scheduler`` also runs kube-scheduler (only useful with a kubelet).
        ``extra_*_args`` are appended to the component's command line.
        ``apiserver_port`` fixes the apiserver's port (0: a free one at each start), so that
        kubeconfigs and in-cluster settings stay valid across restarts.
        ``apiserver_bind_address`` is where the apiserver listens (every other component and
        the clients of this object use 127.0.0.1); ``advertise_address`` the address it
        publishes as the ``kubernetes`` Service's endpoint: on loopback (the default) it
        publishes none, as Endpoints may not hold loopback addresses. ``extra_sans`` are more
        subjectAltNames of the apiserver's certificate (``IP:10.88.0.1``), for a new ``pki/``.
        ``audit`` has the apiserver log every completed request (who, verb, object) to
        ``audit_log``; :func:`audit_entries` reads it.
        """
        self.work_dir = Path(work_dir).resolve()
        self.binaries = binaries if binaries is not None else KubeBinaries.from_cache()
        self.with_scheduler = scheduler
        self.service_cidr = service_cidr
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.extra_controller_manager_args = list(extra_controller_manager_args)
        self.fixed_apiserver_port = apiserver_port
        self.apiserver_bind_address = apiserver_bind_address
        self.advertise_address = advertise_address
        self.extra_sans = list(extra_sans)
        self.pki_dir = self.work_dir / "pki"
        self.log_dir = self.work_dir / "logs"
        self.etcd_data_dir = self.work_dir / "etcd-data"
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.audit_log: Path | None = self.work_dir / "audit.log" if audit else None
        self.etcd_port = 0
        self.apiserver_port = 0
        self.controller_manager_port = 0
        self.scheduler_port = 0
        self.start_seconds = 0.0
        self._procs: list[_Proc] = []
        self._atexit_registered = False

    def _audit_args(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.work_dir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]

    # ------------------------------------------------------------------ paths

    @property
    def server(self) -> str:
        """The apiserver URL, e.g. ``https://127.0.0.1:41234``."""
        return f"https://{_LOOPBACK}:{self.apiserver_port}"

    @property
    def etcd_endpoint(self) -> str:
        """The etcd client URL (plain HTTP on loopback)."""
        return f"http://{_LOOPBACK}:{self.etcd_port}"

    @property
    def ca_cert(self) -> Path:
        """The cluster CA certificate (PEM); it signs every serving and client cert."""
        return self.pki_dir / "ca.crt"

    @property
    def kubectl_path(self) -> Path:
        """The kubectl binary."""
        return self.binaries.kubectl

    @property
    def helm_path(self) -> Path:
        """The helm binary."""
        return self.binaries.helm

    def log_path(self, component: str) -> Path:
        """Log file of ``component`` (``etcd``, ``kube-apiserver``, ...)."""
        return self.log_dir / f"{component}.log"

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the started components, by name (``etcd``, ``kube-apiserver``, ...)."""
        return {p.name: p.popen.pid for p in self._procs}

    @property
    def running(self) -> bool:
        """True while every started component is alive."""
        return bool(self._procs) and all(p.popen.poll() is None for p in self._procs)

    # -------------------------------------------------------------- lifecycle

    def start(self) -> Self:
        """Generate certificates, start the components and wait until usable.

        Returns once ``/readyz`` is OK and the ``default`` namespace and its
        ``default`` ServiceAccount exist. Raises :class:`ControlPlaneError` (with the
        tail of the failing component's log) on failure; nothing is left running.
        """
        if self._procs:
            raise ControlPlaneError("control plane already started")
        missing = self.binaries.missing()
        needed = [
            self.binaries.etcd,
            self.binaries.kube_apiserver,
            self.binaries.kube_controller_manager,
            self.binaries.kubectl,
        ]
        if self.with_scheduler:
            needed.append(self.binaries.kube_scheduler)
        if absent := [p for p in needed if p in missing]:
            raise ControlPlaneError(
                f"missing binaries {[str(p) for p in absent]}; run {BUILD_SCRIPT}"
            )
        began = time.monotonic()
        deadline = began + self.start_timeout
        for d in (self.work_dir, self.pki_dir, self.log_dir, self.work_dir / "kubeconfigs"):
            d.mkdir(parents=True, exist_ok=True)
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            self._make_pki()
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._start_controller_manager(deadline)
            if self.with_scheduler:
                self._start_scheduler(deadline)
            self._wait_api_object("/api/v1/namespaces/default", deadline, "kube-apiserver")
            self._wait_api_object(
                "/api/v1/namespaces/default/serviceaccounts/default",
                deadline,
                "kube-controller-manager",
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate all components (SIGTERM, then SIGKILL), newest first. Idempotent."""
        while self._procs:
            proc = self._procs.pop()
            terminate(proc.popen, timeout)
            proc.log_file.close()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    # ---------------------------------------------------------------- helpers

    def kubectl(
        self,
        *args: str,
        check: bool = False,
        input: str | None = None,
        kubeconfig: Path | str | None = None,
        timeout: float | None = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl (admin kubeconfig unless ``kubeconfig``); output is captured text.

        With ``check`` a non-zero exit raises :class:`subprocess.CalledProcessError`.
        """
        config = str(kubeconfig if kubeconfig is not None else self.kubeconfig)
        return run_kubectl(
            self.binaries.kubectl,
            config,
            args,
            env=self.env(config),
            check=check,
            input=input,
            timeout=timeout,
        )

    def install_crd(self, path: Path, timeout: float = 60.0) -> None:
        """Apply the CRD in ``path`` (server-side: a copy a chart installed is taken over) and
        wait until it is Established.

        The wait reads the condition again and again rather than watching it: a watch the
        API server closes early (as a just-started one may) would end ``kubectl wait``.
        """
        applied = self.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(path), "-o", "name"
        )
        if applied.returncode != 0:
            raise ControlPlaneError(f"kubectl apply -f {path}: {applied.stderr.strip()}")
        name = applied.stdout.strip()  # customresourcedefinition.apiextensions.k8s.io/NAME
        query = '{.status.conditions[?(@.type=="Established")].status}'
        deadline, last = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            found = self.kubectl("get", name, "-o", f"jsonpath={query}")
            if found.returncode == 0 and found.stdout.strip() == "True":
                return
            last = (found.stdout + found.stderr).strip()
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not Established after {timeout:.0f}s: {last!r}")

    def helm(
        self,
        *args: str,
        check: bool = False,
        kubeconfig: Path | str | None = None,
        timeout: float | None = 600.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster, with its cache/config/data dirs in the work dir."""
        config = str(kubeconfig if kubeconfig is not None else self.kubeconfig)
        return run_helm(
            self.binaries.helm,
            config,
            args,
            env=self.env(config),
            helm_home=self.work_dir / "helm",
            check=check,
            timeout=timeout,
        )

    def env(self, kubeconfig: Path | str | None = None) -> dict[str, str]:
        """``os.environ`` plus ``KUBECONFIG`` (admin unless given) and kubectl on PATH."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(kubeconfig if kubeconfig is not None else self.kubeconfig)
        env["PATH"] = f"{self.binaries.kubectl.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        *,
        path: Path | str | None = None,
        duration_seconds: int = 86400,
        create: bool = False,
    ) -> Path:
        """Write a kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        The token comes from the TokenRequest API (``kubectl create token``), so the
        holder has exactly the permissions RBAC grants that ServiceAccount. With
        ``create`` the namespace and ServiceAccount are created when missing.
        Returns the kubeconfig path (default ``kubeconfigs/sa-<ns>-<name>.kubeconfig``).
        """
        if create:
            self._apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": namespace},
                },
            )
        result = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration_seconds}s"
        )
        if result.returncode != 0:
            raise ControlPlaneError(
                f"kubectl create token {namespace}/{name} failed: {result.stderr.strip()}"
            )
        token = result.stdout.strip()
        target = (
            Path(path)
            if path is not None
            else self.work_dir / "kubeconfigs" / f"sa-{namespace}-{name}.kubeconfig"
        )
        user = f"system:serviceaccount:{namespace}:{name}"
        self._write_kubeconfig(target, user, {"token": token}, namespace=namespace)
        return target

    # ------------------------------------------------------------------- PKI

    def issue_certificate(
        self, name: str, subject: str, usage: str, sans: str | None = None
    ) -> tuple[Path, Path]:
        """Sign ``pki/<name>.crt`` (key ``pki/<name>.key``) with the cluster CA.

        ``subject`` like ``/O=system:nodes/CN=system:node:n1``, ``usage`` an extendedKeyUsage
        (``clientAuth``, ``serverAuth`` or both, comma-separated), ``sans`` a subjectAltName
        value (``IP:127.0.0.1,DNS:localhost``). An existing certificate is kept. Needs the CA,
        i.e. a started (or once started) control plane.
        """
        self._leaf(name, subject, usage, sans)
        return self.pki_dir / f"{name}.crt", self.pki_dir / f"{name}.key"

    def cert_kubeconfig(self, name: str, user: str, *, server: str | None = None) -> Path:
        """Write ``kubeconfigs/<name>.kubeconfig`` authenticating with ``pki/<name>.crt``.

        ``server``: the apiserver URL in it (default :attr:`server`).
        """
        return self._cert_kubeconfig(name, user, server=server)

    def _make_pki(self) -> None:
        pki = self.pki_dir
        if not (pki / "ca.crt").exists():
            _openssl(
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
                "-subj", "/CN=eop-test-ca",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
                cwd=pki,
            )  # fmt: skip
        first_service_ip = next(ipaddress.ip_network(self.service_cidr).hosts())
        sans = ",".join(
            [
                f"IP:{_LOOPBACK}",
                "IP:::1",
                f"IP:{first_service_ip}",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
                *self.extra_sans,
            ]
        )
        self._leaf("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        self._leaf("admin", "/O=system:masters/CN=eop-admin", "clientAuth")
        self._leaf(
            "apiserver-kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "clientAuth",
        )
        self._leaf("controller-manager", "/CN=system:kube-controller-manager", "clientAuth")
        self._leaf("scheduler", "/CN=system:kube-scheduler", "clientAuth")
        if not (pki / "sa.key").exists():
            _openssl(
                "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                "-out", "sa.key", cwd=pki,
            )  # fmt: skip
            _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

    def _leaf(self, name: str, subject: str, usage: str, sans: str | None = None) -> None:
        pki = self.pki_dir
        if (pki / f"{name}.crt").exists():
            return
        ext = pki / f"{name}.ext"
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if sans:
            lines.append(f"subjectAltName={sans}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=pki,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "3650", "-extfile", ext.name,
            "-out", f"{name}.crt", cwd=pki,
        )  # fmt: skip
        (pki / f"{name}.csr").unlink()

    def _write_kubeconfig(
        self,
        path: Path,
        user: str,
        credentials: Mapping[str, str],
        *,
        namespace: str = "default",
        server: str | None = None,
    ) -> None:
        """Write a self-contained kubeconfig (JSON, which is valid YAML)."""
        ca_data = base64.b64encode(self.ca_cert.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "eop",
                    "cluster": {
                        "server": server or self.server,
                        "certificate-authority-data": ca_data,
                    },
                }
            ],
            "users": [{"name": user, "user": dict(credentials)}],
            "contexts": [
                {
                    "name": "eop",
                    "context": {"cluster": "eop", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "eop",
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(config, indent=2) + "\n")
        tmp.chmod(0o600)
        tmp.replace(path)

    def _cert_kubeconfig(self, name: str, user: str, *, server: str | None = None) -> Path:
        path = self.work_dir / "kubeconfigs" / f"{name}.kubeconfig"
        self._write_kubeconfig(
            path,
            user,
            {
                "client-certificate-data": base64.b64encode(
                    (self.pki_dir / f"{name}.crt").read_bytes()
                ).decode(),
                "client-key-data": base64.b64encode(
                    (self.pki_dir / f"{name}.key").read_bytes()
                ).decode(),
            },
            server=server,
        )
        return path

    # ------------------------------------------------------------- processes

    def _spawn(self, name: str, argv: Sequence[str]) -> _Proc:
        log = self.log_path(name)
        popen, log_file = spawn_logged(argv, log, cwd=self.work_dir, new_session=True)
        proc = _Proc(name, popen, log, log_file)
        self._procs.append(proc)
        return proc

    def _fail(self, proc: _Proc, what: str) -> ControlPlaneError:
        code = proc.popen.poll()
        state = "running" if code is None else f"exited with {code}"
        return ControlPlaneError(
            f"{proc.name} {what} ({state}); last lines of {proc.log}:\n{log_tail(proc.log)}"
        )

    def _wait(self, proc: _Proc, probe: str, deadline: float) -> None:
        """Poll ``probe`` (a URL path on the component) until it answers 200 OK."""
        last = ""
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise self._fail(proc, "exited during start-up")
            status, body = self._get(probe)
            if status == 200:
                return
            last = f"{status} {body[:300]!r}"
            time.sleep(0.2)
        raise self._fail(proc, f"not ready after {self.start_timeout:.0f}s: {probe} -> {last}")

    def _start_etcd(self, deadline: float) -> None:
        self.etcd_port = free_port()
        peer_port = free_port()
        client = f"http://{_LOOPBACK}:{self.etcd_port}"
        peer = f"http://{_LOOPBACK}:{peer_port}"
        new = not (self.etcd_data_dir / "member").exists()
        proc = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=eop",
                f"--data-dir={self.etcd_data_dir}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=eop={peer}",
                f"--initial-cluster-state={'new' if new else 'existing'}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait(proc, f"{client}/health", deadline)

    def _start_apiserver(self, deadline: float) -> None:
        if self.fixed_apiserver_port:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.apiserver_bind_address, self.fixed_apiserver_port))
                except OSError as exc:
                    raise ControlPlaneError(
                        f"apiserver port {self.apiserver_bind_address}:{self.fixed_apiserver_port}"
                        f" is taken: {exc}"
                    ) from exc
            self.apiserver_port = self.fixed_apiserver_port
        else:
            self.apiserver_port = free_port()
        pki = self.pki_dir
        proc = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_endpoint}",
                f"--bind-address={self.apiserver_bind_address}",
                f"--advertise-address={self.advertise_address}",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                # Aggregated APIs are reached via their endpoints, not ClusterIPs.
                "--enable-aggregator-routing=true",
                # Endpoints may not hold loopback IPs, so an apiserver advertising one cannot
                # publish itself as the `kubernetes` Service's endpoint; don't try (log spam).
                *(
                    ["--endpoint-reconciler-type=none"]
                    if ipaddress.ip_address(self.advertise_address).is_loopback
                    else []
                ),
                "--allow-privileged=true",
                "--profiling=false",
                *self._audit_args(),
                *self.extra_apiserver_args,
            ],
        )
        self._write_kubeconfig(
            self.kubeconfig,
            "eop-admin",
            {
                "client-certificate-data": base64.b64encode(
                    (pki / "admin.crt").read_bytes()
                ).decode(),
                "client-key-data": base64.b64encode((pki / "admin.key").read_bytes()).decode(),
            },
        )
        self._wait(proc, f"{self.server}/readyz", deadline)

    def _start_controller_manager(self, deadline: float) -> None:
        self.controller_manager_port = free_port()
        config = self._cert_kubeconfig("controller-manager", "system:kube-controller-manager")
        pki = self.pki_dir
        proc = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                # No front proxy: don't look up a requestheader CA in the cluster.
                "--authentication-skip-lookup=true",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--bind-address={_LOOPBACK}",
                f"--secure-port={self.controller_manager_port}",
                f"--cert-dir={self.work_dir / 'controller-manager-certs'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--use-service-account-credentials=true",
                "--controllers=*",
                "--leader-elect=false",
                "--profiling=false",
                *self.extra_controller_manager_args,
            ],
        )
        self._wait(proc, f"https://{_LOOPBACK}:{self.controller_manager_port}/healthz", deadline)

    def _start_scheduler(self, deadline: float) -> None:
        self.scheduler_port = free_port()
        config = self._cert_kubeconfig("scheduler", "system:kube-scheduler")
        proc = self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--authentication-skip-lookup=true",
                f"--client-ca-file={self.ca_cert}",
                f"--bind-address={_LOOPBACK}",
                f"--secure-port={self.scheduler_port}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        self._wait(proc, f"https://{_LOOPBACK}:{self.scheduler_port}/healthz", deadline)

    def _wait_api_object(self, path: str, deadline: float, blame: str) -> None:
        proc = next(p for p in self._procs if p.name == blame)
        apiserver = next(p for p in self._procs if p.name == "kube-apiserver")
        last = ""
        while time.monotonic() < deadline:
            for p in (apiserver, proc):
                if p.popen.poll() is not None:
                    raise self._fail(p, "exited during start-up")
            status, body = self._get(self.server + path)
            if status == 200:
                return
            last = f"{status} {body[:300]!r}"
            time.sleep(0.2)
        raise self._fail(proc, f"{path} missing after {self.start_timeout:.0f}s: {last}")

    def dry_run_create(self, path: str, obj: Mapping[str, Any]) -> tuple[int, str]:
        """POST ``obj`` to ``path`` (``/apis/GROUP/VERSION/namespaces/NS/PLURAL``) as the admin,
        validated as ``kubectl apply`` is (strict field validation) and stored nowhere
        (``dryRun=All``): the HTTP status and the API server's message.

        One request in this process, where ``kubectl`` would start a process and ask for
        discovery first: for tests that try many manifests.
        """
        request = urllib.request.Request(
            f"{self.server}{path}?dryRun=All&fieldValidation=Strict",
            data=json.dumps(obj).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        try:
            with urllib.request.urlopen(request, timeout=30, context=ctx) as resp:
                return int(resp.status), ""
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            try:
                return exc.code, str(json.loads(body).get("message", body))
            except json.JSONDecodeError:
                return exc.code, body

    def _get(self, url: str) -> tuple[int, str]:
        """GET ``url``; the apiserver is verified and sees the admin client cert."""
        if url.startswith(self.server):
            ctx = ssl.create_default_context(cafile=str(self.ca_cert))
            ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        else:  # controller-manager/scheduler: self-signed serving certs, /healthz only
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                return int(resp.status), resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as exc:
            return 0, str(exc)

    def _apply(self, *objects: Mapping[str, object]) -> None:
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        result = self.kubectl("apply", "-f", "-", input=manifest)
        if result.returncode != 0:
            raise ControlPlaneError(f"kubectl apply failed: {result.stderr.strip()}")


# -------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m devenv.kube up --dir DIR``: run a control plane in the foreground."""
    parser = argparse.ArgumentParser(prog="python -m devenv.kube", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a control plane; stop with Ctrl-C / SIGTERM")
    up.add_argument("--dir", required=True, type=Path, help="work dir (certs, data, logs)")
    up.add_argument("--no-build", action="store_true", help="do not run build-kube.sh")
    up.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
    sub.add_parser("build", help="build the binaries (devenv/build-kube.sh)")
    args = parser.parse_args(argv)

    if args.command == "build":
        build_binaries()
        return 0

    binaries = KubeBinaries.from_cache() if args.no_build else build_binaries()
    stop = stop_on_signals()
    cp = ControlPlane(args.dir, binaries=binaries, scheduler=args.scheduler)
    try:
        cp.start()
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"control plane up in {cp.start_seconds:.1f}s: {cp.server}", file=sys.stderr)
        print(f"logs: {cp.log_dir}", file=sys.stderr)
        print(f"kubectl: {cp.kubectl_path}", file=sys.stderr)
        print(f"export KUBECONFIG={cp.kubeconfig}", file=sys.stderr)
        print(cp.kubeconfig, flush=True)
        if not serve_until_stopped(stop, lambda: cp.running, 0.5):
            dead = [p.name for p in cp._procs if p.popen.poll() is not None]
            print(f"error: component(s) exited: {dead}; see {cp.log_dir}", file=sys.stderr)
            return 1
        print("stopping ...", file=sys.stderr)
        return 0
    finally:
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
