"""Checkpoints in object storage: deleting a pipeline's checkpoint root.

``eop checkpoint delete <root>`` runs this in the Job the operator creates for
``checkpoint.retention: Delete`` (the operator never holds the object store's
credentials; the Job has them as the driver does).  It goes through Hadoop's
FileSystem, as Spark does, so whatever Spark can write there it can delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eop_spark.contract.run_config import RunConfig
from eop_spark.runtime.session import build_session


def delete_checkpoint_root(root: str, options: Mapping[str, str]) -> int:
    """Delete every object under ``root``; return how many files there were (0: none).

    ``options`` are Hadoop settings (``fs.s3a.*``, the pipeline's ``checkpoint.options``).
    """
    config = RunConfig.offline("eop.checkpoint-delete", root, "SELECT 1")
    spark_conf = {f"spark.hadoop.{k}": v for k, v in options.items()}
    config = config.model_copy(
        update={"spark": config.spark.model_copy(update={"master": "local[1]", "conf": spark_conf})}
    )
    spark = build_session(config, [])
    try:
        jvm: Any = spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        if not fs.exists(path):
            return 0
        files = fs.listFiles(path, True)
        count = 0
        while files.hasNext():
            files.next()
            count += 1
        fs.delete(path, True)
        return count
    finally:
        spark.stop()
