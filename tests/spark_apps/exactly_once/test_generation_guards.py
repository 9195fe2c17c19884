"""What a new generation checks before it starts: earlier progress, a kept checkpoint (pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eop_spark.contract.errors import CheckpointLost, ProgressMissing
from eop_spark.contract.run_config import RunConfig
from eop_spark.contract.termination import failure_line
from eop_spark.exactly_once.generation_guards import (
    check_checkpoint_kept,
    check_progress_kept,
    earlier_progress,
)
from eop_spark.exactly_once.keep_alive import FALLBACK_INTERVAL_S, refresh_interval_s
from eop_spark.exactly_once.offsets_log import LocalFiles

METADATA = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})


def generation(root: Path, k: int, initial: str, batches: list[str], completed: int) -> None:
    """A checkpoint ``gen-<k>`` with ``batches`` planned and the first ``completed`` done."""
    gen = root / f"gen-{k}"
    (gen / "offsets").mkdir(parents=True)
    (gen / "commits").mkdir()
    (gen / "sources" / "0").mkdir(parents=True)
    (gen / "sources" / "0" / "0").write_text(f"\x00v1\n{initial}")
    for n, line in enumerate(batches):
        (gen / "offsets" / str(n)).write_text(f"v1\n{METADATA}\n{line}")
    for n in range(completed):
        (gen / "commits" / str(n)).write_text("v1\n{}")


def config(root: Path, k: int, **spec: Any) -> RunConfig:
    return RunConfig.model_validate(
        {
            "pipeline": "ns.p",
            "source": {"kafka": {"bootstrapServers": "b:9092", "topics": ["in"]} | spec},
            "transform": {"sql": "SELECT value FROM source"},
            "sink": {"kafka": {"bootstrapServers": "b:9092", "topic": "out"}},
            "transactionalIdPrefix": "eop.ns.p",
            "progressGroup": "eop.ns.p",
            "checkpointRoot": str(root),
            "generation": k,
        }
    )


def test_earlier_progress_counts_partitions_a_completed_batch_read(tmp_path: Path) -> None:
    # gen-0 read partition 0 only (1 stayed at its start); its batch 1 never completed.
    generation(
        tmp_path, 0, '{"in":{"0":0,"1":5}}', ['{"in":{"0":4,"1":5}}', '{"in":{"0":9,"1":9}}'], 1
    )
    # gen-1 read both; gen-3 is the current one and does not count, nor do foreign dirs.
    generation(tmp_path, 1, '{"in":{"0":4,"1":5}}', ['{"in":{"0":6,"1":7}}'], 1)
    generation(tmp_path, 3, '{"in":{"0":0,"1":0}}', ['{"in":{"0":50,"1":50}}'], 1)
    (tmp_path / "gen-x").mkdir()
    earlier = earlier_progress(str(tmp_path), LocalFiles(), 3)
    assert earlier.offsets == {("in", 0): 6, ("in", 1): 7}
    assert earlier.generation == {("in", 0): 1, ("in", 1): 1}
    assert earlier_progress(str(tmp_path), LocalFiles(), 1).offsets == {("in", 0): 4}
    assert earlier_progress(str(tmp_path / "none"), LocalFiles(), 1).offsets == {}


def test_missing_progress_names_the_partitions_and_the_way_out(tmp_path: Path) -> None:
    generation(tmp_path, 0, '{"in":{"0":0,"1":0}}', ['{"in":{"0":4,"1":5}}'], 1)
    earlier = earlier_progress(str(tmp_path), LocalFiles(), 1)
    partitions = [("in", 0), ("in", 1)]
    with pytest.raises(ProgressMissing) as refused:
        check_progress_kept(config(tmp_path, 1), earlier, {("in", 0): 4}, partitions)
    message = refused.value.message
    assert "in-1" in message and "in-0" not in message and "gen-0" in message
    assert "allowMissingProgress" in message and "\n" not in message
    assert (
        check_progress_kept(config(tmp_path, 1), earlier, {("in", 0): 4, ("in", 1): 5}, partitions)
        == []
    )
    # Opted in: the missing ones start at startingOffsets; a partition no longer read is not asked.
    opted = config(tmp_path, 1, allowMissingProgress=True)
    assert check_progress_kept(opted, earlier, {}, partitions) == [("in", 0), ("in", 1)]
    assert check_progress_kept(config(tmp_path, 1), earlier, {("in", 0): 4}, [("in", 0)]) == []


def test_progress_that_went_back_is_refused_unless_the_generation_reprocesses(
    tmp_path: Path,
) -> None:
    generation(tmp_path, 0, '{"in":{"0":0,"1":0}}', ['{"in":{"0":4,"1":5}}'], 1)
    earlier = earlier_progress(str(tmp_path), LocalFiles(), 1)
    partitions = [("in", 0), ("in", 1)]
    with pytest.raises(ProgressMissing) as refused:
        check_progress_kept(config(tmp_path, 1), earlier, {("in", 0): 4, ("in", 1): 2}, partitions)
    message = refused.value.message
    assert "went back: it holds in-1 at 2, below the 5 gen-0 completed" in message
    assert "in-0" not in message and "\n" not in message
    # Ahead is fine (a runner committed after the checkpoint), and a stateless reset is asked.
    ahead = {("in", 0): 9, ("in", 1): 5}
    assert check_progress_kept(config(tmp_path, 1), earlier, ahead, partitions) == []
    stateless = config(tmp_path, 1).model_copy(update={"reset_progress": True})
    assert check_progress_kept(stateless, earlier, {("in", 0): 0, ("in", 1): 0}, partitions) == []


def test_a_lost_checkpoint_root_still_refuses_partitions_the_operator_saw_g_hold(
    tmp_path: Path,
) -> None:
    nothing = earlier_progress(str(tmp_path / "lost"), LocalFiles(), 2)  # no earlier logs
    seen = config(tmp_path, 2).model_copy(update={"committed_partitions": {"in": [0, 1]}})
    with pytest.raises(ProgressMissing) as refused:
        check_progress_kept(seen, nothing, {("in", 0): 4}, [("in", 0), ("in", 1), ("in", 2)])
    message = refused.value.message
    assert "no committed offset for in-1, which the operator saw it hold before" in message
    assert "in-0" not in message and "in-2" not in message and "\n" not in message
    assert check_progress_kept(config(tmp_path, 2), nothing, {}, [("in", 1)]) == []


def test_an_emptied_checkpoint_root_is_a_lost_checkpoint_once_g_has_held_progress(
    tmp_path: Path,
) -> None:
    """A prefix deleted in object storage (or a volume emptied): the runner tells the operator,
    which starts the next generation from G; a first start or a new generation is no loss."""
    held = config(tmp_path, 2).model_copy(update={"committed_partitions": {"in": [0, 1]}})
    with pytest.raises(CheckpointLost) as lost:
        check_checkpoint_kept(held, LocalFiles())
    message = lost.value.message
    assert str(tmp_path) in message and "eop.ns.p" in message and "2 partitions" in message
    assert "--generation 3" in message and failure_line(lost.value).startswith(
        "eop: error: [CheckpointLost] "
    )
    check_checkpoint_kept(config(tmp_path, 0), LocalFiles())  # nothing held: a first start
    started = held.model_copy(update={"generation_reason": "CheckpointLost"})
    check_checkpoint_kept(started, LocalFiles())  # the new generation the operator started
    generation(tmp_path, 1, '{"in":{"0":0}}', [], 0)
    with pytest.raises(CheckpointLost):  # emptied directories left behind hold no checkpoint
        check_checkpoint_kept(held, LocalFiles())
    (tmp_path / "gen-1" / "metadata").write_text('{"id":"q"}')
    check_checkpoint_kept(held, LocalFiles())  # a query's checkpoint is there: not lost


def test_refresh_interval_is_a_quarter_of_the_broker_retention() -> None:
    assert refresh_interval_s(60_000) == 15.0
    assert refresh_interval_s(7 * 24 * 3600 * 1000) == 42 * 3600
    assert refresh_interval_s(None) == FALLBACK_INTERVAL_S
