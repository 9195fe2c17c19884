"""The seed use case: count ad impressions perfectly, in two pipelines.

1. ``clean`` (record-wise, partitioned mode): raw impression events, JSON such as
   ``{"impression_id": "i-1", "campaign_id": "c-7", "event_time": "2026-05-01T10:00:03Z",
   "placement": "top", "user_agent": "Mozilla/5.0", "is_bot": false}``,
   are parsed; events with no id, no campaign, an unreadable time, or from a bot
   are dropped; the rest is projected to ``{"impression_id", "campaign_id",
   "event_time", "placement"}`` keyed by the impression id.
2. ``count`` (stateful, coordinated mode): impressions per campaign per one-minute
   event-time window, emitted once per window when the watermark passes it
   (output mode append), as ``{"campaign_id", "window_start", "window_end",
   "impressions"}`` keyed by the campaign id.

Both exist as SQL (for ``transform.sql``) and as Python callables (for
``transform.python``: module ``eop_spark.examples.impressions``).  The SQL
version of the count has no watermark (Spark SQL cannot declare one), so it
needs output mode ``update``, where the last record of a key is its value: it is
keyed by campaign and window start.  The Python version is the one to run.

Sample raw events for both (:func:`sample_event`; the demo writes them too):
``python -m eop_spark.examples.impressions produce --bootstrap-servers HOST:PORT``
writes a few to ``impressions-raw`` (the laptop quick start in the README).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from eop_spark.exactly_once.sink_contract import PROVENANCE_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: How late an impression may arrive and still be counted in its window.
WATERMARK_DELAY = "30 seconds"
#: The counting window.
WINDOW = "1 minute"
#: User agents treated as robots (case-insensitive regular expression).
BOT_AGENTS = "bot|crawler|spider|headless"

RAW_SCHEMA = (
    "impression_id STRING, campaign_id STRING, event_time STRING, placement STRING, "
    "user_agent STRING, is_bot BOOLEAN"
)
CLEAN_SCHEMA = "impression_id STRING, campaign_id STRING, event_time TIMESTAMP, placement STRING"


def _raw(field: str) -> str:
    return f"get_json_object(CAST(value AS STRING), '$.{field}')"


#: ``clean`` as SQL: a plain projection/filter, so the runner keeps provenance itself.
CLEAN_IMPRESSIONS_SQL = f"""
SELECT
  {_raw("impression_id")} AS key,
  to_json(named_struct(
    'impression_id', {_raw("impression_id")},
    'campaign_id', {_raw("campaign_id")},
    'event_time', try_to_timestamp({_raw("event_time")}),
    'placement', {_raw("placement")}
  )) AS value
FROM source
WHERE {_raw("impression_id")} IS NOT NULL
  AND {_raw("campaign_id")} IS NOT NULL
  AND try_to_timestamp({_raw("event_time")}) IS NOT NULL
  AND coalesce({_raw("is_bot")}, 'false') <> 'true'
  AND NOT lower(coalesce({_raw("user_agent")}, '')) RLIKE '{BOT_AGENTS}'
"""

#: ``count`` as SQL (no watermark in SQL: run it with outputMode update).  Each micro-batch
#: re-emits the windows it changed; a consumer (or compaction) keeps the last record per key,
#: so the key names the window: ``c-7@2026-05-01 10:00:00`` (campaign, window start in UTC).
COUNT_IMPRESSIONS_SQL = f"""
SELECT
  concat(get_json_object(CAST(value AS STRING), '$.campaign_id'), '@',
         CAST(w.start AS STRING)) AS key,
  to_json(named_struct(
    'campaign_id', get_json_object(CAST(value AS STRING), '$.campaign_id'),
    'window_start', w.start,
    'window_end', w.end,
    'impressions', count(*)
  )) AS value
FROM (
  SELECT value,
         window(CAST(get_json_object(CAST(value AS STRING), '$.event_time') AS TIMESTAMP),
                '{WINDOW}') AS w
  FROM source
)
GROUP BY get_json_object(CAST(value AS STRING), '$.campaign_id'), w
"""


def _is_bot(event: Column) -> Column:
    from pyspark.sql import functions as F

    agent = F.lower(F.coalesce(event["user_agent"], F.lit("")))
    return F.coalesce(event["is_bot"], F.lit(False)) | agent.rlike(BOT_AGENTS)


def clean_impressions(source: DataFrame) -> DataFrame:
    """``clean`` as a Python transform; keeps the provenance columns (partitioned mode)."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), RAW_SCHEMA)
    parsed = source.withColumn("event", event).withColumn(
        "event_time", F.try_to_timestamp(F.col("event.event_time"))
    )
    valid = parsed.where(
        F.col("event.impression_id").isNotNull()
        & F.col("event.campaign_id").isNotNull()
        & F.col("event_time").isNotNull()
        & ~_is_bot(F.col("event"))
    )
    return valid.select(
        F.col("event.impression_id").alias("key"),
        F.to_json(
            F.struct(
                F.col("event.impression_id").alias("impression_id"),
                F.col("event.campaign_id").alias("campaign_id"),
                F.col("event_time"),
                F.col("event.placement").alias("placement"),
            )
        ).alias("value"),
        *PROVENANCE_COLUMNS,
    )


def count_impressions(source: DataFrame) -> DataFrame:
    """``count`` as a Python transform: per campaign per minute, with a watermark (append)."""
    from pyspark.sql import functions as F

    impression = F.from_json(F.col("value").cast("string"), CLEAN_SCHEMA)
    events = source.select(
        impression["campaign_id"].alias("campaign_id"), impression["event_time"].alias("event_time")
    )
    counts = (
        events.where(F.col("campaign_id").isNotNull() & F.col("event_time").isNotNull())
        .withWatermark("event_time", WATERMARK_DELAY)
        .groupBy("campaign_id", F.window("event_time", WINDOW))
        .count()
    )
    return counts.select(
        F.col("campaign_id").alias("key"),
        F.to_json(
            F.struct(
                "campaign_id",
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                F.col("count").alias("impressions"),
            )
        ).alias("value"),
    )


# ----------------------------------------------------------------------------- sample events

#: The topic of raw impressions in the example manifests.
RAW_TOPIC = "impressions-raw"
#: The campaigns sample events name.
CAMPAIGNS = [f"c-{i}" for i in range(1, 9)]
#: Event time starts here and advances ``SIM_SECONDS_PER_EVENT`` per event produced.
BASE_TIME = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)
SIM_SECONDS_PER_EVENT = 0.02
#: How long :func:`produce_samples` waits for the broker and the topic.
TOPIC_WAIT_S = 120.0


def sample_event(run: str, n: int, rng: random.Random) -> tuple[dict[str, Any], bool]:
    """Sample raw event number ``n`` of run ``run``, and whether ``clean`` keeps it.

    About 8 % are dropped by the clean pipeline: bot flag, bot user agent, unreadable time,
    missing campaign (each id stays unique, so the recount is exact).
    """
    ts = BASE_TIME + timedelta(seconds=n * SIM_SECONDS_PER_EVENT + rng.uniform(0, 5))
    event: dict[str, Any] = {
        "impression_id": f"i-{run}-{n}",
        "campaign_id": rng.choice(CAMPAIGNS),
        "event_time": ts.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "placement": rng.choice(["top", "side", "feed"]),
        "user_agent": "Mozilla/5.0",
        "is_bot": False,
    }
    kind = rng.random()
    if kind < 0.03:
        event["is_bot"] = True
    elif kind < 0.05:
        event["user_agent"] = "Mozilla/5.0 (compatible; Googlebot/2.1)"
    elif kind < 0.065:
        event["event_time"] = "not-a-time"
    elif kind < 0.08:
        del event["campaign_id"]
    else:
        return event, True
    return event, False


def _wait_for_topic(producer: Any, topic: str, deadline: float) -> None:
    """Wait until the broker answers and has ``topic`` (it may still be starting)."""
    from confluent_kafka import KafkaException

    while True:
        try:
            found = producer.list_topics(topic, timeout=5).topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return
        except KafkaException:
            pass  # not up yet
        if time.monotonic() > deadline:
            raise SystemExit(f"topic {topic} not found within {TOPIC_WAIT_S:.0f} s")
        time.sleep(0.5)


def produce_samples(
    bootstrap_servers: str, events: int, topic: str = RAW_TOPIC, seed: int = 7
) -> tuple[int, int]:
    """Write ``events`` sample raw impressions to ``topic``: (written, kept by ``clean``).

    Waits up to :data:`TOPIC_WAIT_S` for the broker and the topic first.  Each
    call writes impressions of ids of its own (``i-<run>-<n>``).
    """
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 20}
    )
    _wait_for_topic(producer, topic, time.monotonic() + TOPIC_WAIT_S)
    rng = random.Random(seed)
    run = uuid.uuid4().hex[:6]
    kept = 0
    for n in range(events):
        event, valid = sample_event(run, n, rng)
        kept += valid
        value = json.dumps(event).encode()
        producer.produce(topic, key=event["impression_id"].encode(), value=value)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise SystemExit(f"the last sample events were not written to {topic} within 60 s")
    return events, kept


def main(argv: Sequence[str] | None = None) -> int:
    """``produce --bootstrap-servers HOST:PORT [--events N] [--topic T]``: sample events."""
    parser = argparse.ArgumentParser(prog="python -m eop_spark.examples.impressions")
    commands = parser.add_subparsers(dest="command", required=True)
    produce = commands.add_parser("produce", help="write sample raw impression events")
    produce.add_argument("--bootstrap-servers", required=True, metavar="HOST:PORT")
    produce.add_argument("--events", type=int, default=1000)
    produce.add_argument("--topic", default=RAW_TOPIC)
    args = parser.parse_args(argv)
    written, kept = produce_samples(args.bootstrap_servers, args.events, args.topic)
    print(f"wrote {written} impressions to {args.topic} ({kept} kept by impressions-clean)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
