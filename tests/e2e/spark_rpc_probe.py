"""Ask a Spark driver's RPC endpoint for its scheduler as a Spark client would, with and
without the pipeline's RPC key.

Used by the e2e tests from the test's own machine (the single-node cluster's drivers listen
on the host network) and, as a script, from a pod on another node of the multi-node cluster
(the file is mounted from a ConfigMap into a pod of the eop-spark image)::

    python spark_rpc_probe.py HOST PORT [--key-file FILE]

prints one JSON object: for a client without a key, one with a wrong key and (with
``--key-file``, the Secret's file) one with the key, ``null`` when the driver answered, else
the error. Only pyspark and ``eop_spark.contract.owned_settings`` (both in the image) are needed.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: The driver endpoint executors register with.
ENDPOINT = "CoarseGrainedScheduler"
#: Short timeouts: a refused client fails at once, an unreachable driver within these.
_TIMEOUTS = {
    "spark.rpc.askTimeout": "15s",
    "spark.rpc.lookupTimeout": "15s",
    "spark.network.timeout": "15s",
}


def probe_spark_rpc(
    address: tuple[str, int], keys: Mapping[str, str | None]
) -> dict[str, str | None]:
    """For each named key, whether the driver at ``address`` lets a client with it in.

    ``keys``: name -> the RPC key to authenticate with, as Spark uses it (the base64 of the
    key file), None for a client without authentication. Returns name -> None when the driver
    answered, else the error (innermost cause first). One JVM of the local pyspark for all of
    them, no SparkContext: Spark's RpcEnv in client mode (it listens nowhere).
    """
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(SparkConf().set("spark.ui.enabled", "false"))
    try:
        return {name: _ask(gateway.jvm, address, key) for name, key in keys.items()}
    finally:
        gateway.shutdown()
        gateway.proc.kill()


def _ask(jvm: Any, address: tuple[str, int], key: str | None) -> str | None:
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    from eop_spark.contract.owned_settings import RPC_SECURITY_CONF

    conf = jvm.org.apache.spark.SparkConf(False)
    for name, value in _TIMEOUTS.items():
        conf.set(name, value)
    if key is not None:  # the settings the operator gives driver and executors
        for name, value in {**RPC_SECURITY_CONF, "spark.authenticate.secret": key}.items():
            conf.set(name, value)
    config = getattr(getattr(jvm.org.apache.spark.internal.config, "package$"), "MODULE$")
    security = jvm.org.apache.spark.SecurityManager(
        conf, jvm.scala.Option.empty(), config.AUTH_SECRET_FILE()
    )
    env = jvm.org.apache.spark.rpc.RpcEnv.create("eop-probe", "127.0.0.1", 0, conf, security, True)
    try:
        target = jvm.org.apache.spark.rpc.RpcAddress(address[0], address[1])
        env.setupEndpointRef(target, ENDPOINT)
        return None
    except Py4JJavaError as exc:  # the client was refused: say why, innermost cause first
        causes, cause = [], exc.java_exception
        while cause is not None:
            causes.append(str(cause.toString()))
            cause = cause.getCause()
        return " <- ".join(reversed(causes))[:400]
    finally:
        env.shutdown()


def probe_keys(key: str | None) -> dict[str, str | None]:
    """The three clients of a probe: no key, a wrong key of the same length, and ``key``."""
    wrong = "A" * len(key or "A" * 44)
    return {"no key": None, "wrong key": wrong, **({"the key": key} if key else {})}


def main(argv: list[str] | None = None) -> int:
    """Probe HOST:PORT; print the answers as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--key-file", type=Path, help="the RPC key Secret's file")
    args = parser.parse_args(argv)
    key = base64.b64encode(args.key_file.read_bytes()).decode() if args.key_file else None
    answers = probe_spark_rpc((args.host, args.port), probe_keys(key))
    print(json.dumps(answers), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
