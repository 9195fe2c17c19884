/*
 * The partitioned commit mode's task, in the executor JVM (see eop_spark.exactly_once.partitioned
 * for the protocol, and its jvm_writer module for how the runner builds and calls this class).
 *
 * Each Spark task of a batch reads one source partition (t, p), range [from, until), and with
 * the transactional producer <prefix>.<t>.<p>: makes sure the producer holds the id
 * (initTransactions when built), reads c = G's stable committed offset for (t, p) unless it
 * knows it, skips if c >= until, else begins, adds {(t, p): until} for G first, sends the rows
 * with offset >= c and commits. A range that takes longer than a third of the transaction timeout
 * is committed in several transactions (see send). One producer per id lives as long as the JVM,
 * so the tasks of every batch that run here share it; a task holds its id's lock for the whole
 * transaction.
 * Where the driver's JVM runs the tasks (local mode), the runner has it take the run's ids and
 * read G for them while the query is planned and started (prepare), so the first batch's tasks
 * need not.
 *
 * Failures reach the driver as exceptions whose message starts with the name of the
 * eop_spark.contract.errors class the Python side raises for them (from_failure there reads it
 * from the Java exception's text): SinkRetryable (the batch may run again), ProducerFenced,
 * PipelineFailed.
 */
package io.exactlyonce.eop;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public final class PartitionedWriter {
  /** The local property with the batch's end offsets and marker (BATCH_PROPERTY in Python). */
  public static final String BATCH_PROPERTY = "eop.partitioned.batch";
  /** The local property Spark gives every job of a streaming batch. */
  public static final String SPARK_BATCH_PROPERTY = "streaming.sql.batchId";

  static final String SOURCE_TOPIC = "__eop_src_topic";
  static final String SOURCE_PARTITION = "__eop_src_partition";
  static final String SOURCE_OFFSET = "__eop_src_offset";
  static final int ATTEMPTS = 3;
  /** The eop_spark.contract.errors class of a transaction that outlived its timeout. */
  static final String TIMED_OUT_KIND = "TransactionTimedOut";
  /** The eop_spark.contract.errors class of retriable errors that outlasted a call. */
  static final String BROKER_AWAY_KIND = "BrokerUnavailable";
  /** Appended to the batch's marker for an intermediate commit (see commitSoFar). */
  static final String PARTIAL = ":partial";
  /** A transaction lives at most this share of transaction.timeout.ms before a task commits. */
  static final long TIMEOUT_SHARE = 3;
  /** Rows between two looks at the clock (System.nanoTime per row would cost the fast path). */
  static final int ROWS_PER_CLOCK_CHECK = 1024;
  static final ObjectMapper JSON = new ObjectMapper();

  /** One transactional id's producer, what it knows of G per run, and the run it last served. */
  static final class Held {
    final KafkaProducer<byte[], byte[]> producer;
    final Map<String, Long> known = new HashMap<>();
    String lastRun = "";

    Held(KafkaProducer<byte[], byte[]> producer) {
      this.producer = producer;
    }
  }

  /**
   * Per id: the lock a task holds for its whole transaction, the producer (if any), and the
   * preparation a task waits for before it takes the lock (see prepare).
   */
  static final class Slot {
    Held held;
    volatile CompletableFuture<Void> prepared = CompletableFuture.completedFuture(null);
  }

  static final Map<String, Slot> SLOTS = new ConcurrentHashMap<>();
  static final Map<String, KafkaConsumer<byte[], byte[]>> READERS = new HashMap<>();
  static final Logger LOG = LoggerFactory.getLogger(PartitionedWriter.class);
  /** The threads that prepare ids (daemons: they never keep the JVM up). */
  static final ExecutorService PREPARING =
      Executors.newFixedThreadPool(
          8,
          work -> {
            Thread thread = new Thread(work, "eop-prepare");
            thread.setDaemon(true);
            return thread;
          });

  private PartitionedWriter() {}

  /** A failure the driver maps to the eop_spark.contract.errors class ``kind``. */
  static final class TaskFailure extends RuntimeException {
    private static final long serialVersionUID = 1L;

    TaskFailure(String kind, String message, Throwable cause) {
      super("eop_spark.contract.errors." + kind + ": " + message, cause);
    }
  }

  /**
   * What every task of a run shares: parsed from the settings JSON once per JVM (see {@link
   * #settings}), read-only after.
   */
  static final class Settings {
    final String topic;
    final String prefix;
    final String group;
    final String run;
    final Map<String, Object> producer;
    final Map<String, Object> reader;
    /**
     * Source topic -> the progress topic G keeps its offsets under (source and sink on different
     * clusters, see eop_spark.contract.progress_names); null: G keeps them under the source names.
     */
    final Map<String, String> progressTopics;
    /** The producers' transaction.timeout.ms. */
    final long timeoutMs;
    /** How long a transaction may stay open before the task commits what it produced. */
    final long commitAfterNanos;

    Settings(JsonNode node) {
      topic = node.get("topic").asText();
      prefix = node.get("prefix").asText();
      group = node.get("group").asText();
      run = node.get("run").asText();
      producer = properties(node.get("producer"));
      reader = properties(node.get("reader"));
      JsonNode topics = node.get("progressTopics");
      if (topics == null || topics.isNull()) {
        progressTopics = null;
      } else {
        progressTopics = new HashMap<>();
        topics.fields().forEachRemaining(e -> progressTopics.put(e.getKey(), e.getValue().asText()));
      }
      timeoutMs =
          Long.parseLong(String.valueOf(producer.getOrDefault("transaction.timeout.ms", "60000")));
      commitAfterNanos = timeoutMs * 1_000_000L / TIMEOUT_SHARE;
    }

    String transactionalId(String topic, int partition) {
      return prefix + "." + topic + "." + partition;
    }

    /** The topic-partition G keeps source partition ``tp``'s offset under. */
    TopicPartition stored(TopicPartition tp) {
      if (progressTopics == null) {
        return tp;
      }
      String topic = progressTopics.get(tp.topic());
      if (topic == null) { // never the source name: the sink cluster may have another such topic
        throw new TaskFailure(
            "PipelineFailed",
            "no progress topic is known for source topic " + tp.topic() + " in this run",
            null);
      }
      return new TopicPartition(topic, tp.partition());
    }

    /** ``offset`` and ``metadata`` for G, keyed by where G keeps source partition ``tp``. */
    Map<TopicPartition, OffsetAndMetadata> forGroup(TopicPartition tp, long offset, String meta) {
      return Collections.singletonMap(stored(tp), new OffsetAndMetadata(offset, meta));
    }

    static Map<String, Object> properties(JsonNode node) {
      Map<String, Object> props = new HashMap<>();
      node.fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
      return props;
    }
  }

  /** Settings JSON -> its parsed Settings: a run's tasks and batches share one string. */
  static final Map<String, Settings> PARSED = new ConcurrentHashMap<>();
  /** The most settings PARSED keeps (a JVM serves one run; tests run many in one JVM). */
  static final int PARSED_KEPT = 16;

  /** The Settings of ``json``, parsed once per JVM for as long as a run sends the same string. */
  static Settings settings(String json) throws IOException {
    Settings known = PARSED.get(json);
    if (known != null) {
      return known;
    }
    Settings parsed = new Settings(JSON.readTree(json));
    if (PARSED.size() >= PARSED_KEPT) {
      PARSED.clear();
    }
    PARSED.put(json, parsed);
    return parsed;
  }

  /** Where each column the task reads sits in the selected row. */
  static final class Layout {
    final int value;
    final boolean valueIsBinary;
    final int key;
    final boolean keyIsBinary;
    final int headers;
    final int partition;
    final int sourceTopic;
    final int sourcePartition;
    final int sourceOffset;

    Layout(StructType schema) {
      value = schema.fieldIndex("value");
      valueIsBinary = schema.fields()[value].dataType() instanceof BinaryType;
      key = index(schema, "key");
      keyIsBinary = key >= 0 && schema.fields()[key].dataType() instanceof BinaryType;
      headers = index(schema, "headers");
      partition = index(schema, "partition");
      sourceTopic = index(schema, SOURCE_TOPIC);
      sourcePartition = schema.fieldIndex(SOURCE_PARTITION);
      sourceOffset = schema.fieldIndex(SOURCE_OFFSET);
    }

    static int index(StructType schema, String name) {
      return schema.getFieldIndex(name).isDefined() ? schema.fieldIndex(name) : -1;
    }

    byte[] bytes(InternalRow row, int column, boolean binary) {
      if (column < 0 || row.isNullAt(column)) {
        return null;
      }
      return binary ? row.getBinary(column) : row.getUTF8String(column).getBytes();
    }

    ProducerRecord<byte[], byte[]> record(String topic, InternalRow row) {
      Integer target = partition >= 0 && !row.isNullAt(partition) ? row.getInt(partition) : null;
      List<Header> list = null;
      if (headers >= 0 && !row.isNullAt(headers)) {
        ArrayData array = row.getArray(headers);
        list = new ArrayList<>(array.numElements());
        for (int i = 0; i < array.numElements(); i++) {
          InternalRow header = array.getStruct(i, 2);
          byte[] headerValue = header.isNullAt(1) ? null : header.getBinary(1);
          list.add(new RecordHeader(header.getUTF8String(0).toString(), headerValue));
        }
      }
      return new ProducerRecord<>(
          topic, target, bytes(row, key, keyIsBinary), bytes(row, value, valueIsBinary), list);
    }

    String topicOf(InternalRow row, String only) {
      return sourceTopic >= 0 ? row.getUTF8String(sourceTopic).toString() : only;
    }
  }

  /** The batch's end offsets and marker, from the task's local properties. */
  static final class Batch {
    final Map<TopicPartition, Long> end = new HashMap<>();
    final String marker;
    final String topic;

    Batch(String value, String sparkBatch) throws Exception {
      if (value == null || value.isEmpty()) {
        throw new TaskFailure(
            "PipelineFailed",
            "a partitioned task found no " + BATCH_PROPERTY + " property: it runs outside the"
                + " batch job that the partitioned sink starts",
            null);
      }
      JsonNode node = JSON.readTree(value);
      marker = node.get("marker").asText();
      String named = marker.substring(marker.lastIndexOf(':') + 1);
      if (sparkBatch != null && !named.equals(sparkBatch)) {
        throw new TaskFailure(
            "PipelineFailed",
            "a partitioned task of batch " + sparkBatch + " was given the offsets of batch "
                + named + ": nothing is committed",
            null);
      }
      String one = null;
      for (JsonNode entry : node.get("end")) {
        TopicPartition tp = new TopicPartition(entry.get(0).asText(), entry.get(1).asInt());
        end.put(tp, entry.get(2).asLong());
        one = one == null || one.equals(tp.topic()) ? tp.topic() : "";
      }
      topic = one == null || one.isEmpty() ? null : one;
    }
  }

  /**
   * Run the batch's tasks over ``df`` (the output columns plus the provenance columns); return
   * one outcome (JSON) per task that saw rows. The caller sets BATCH_PROPERTY around the call.
   */
  public static List<String> write(Dataset<Row> df, String settingsJson) {
    StructType schema = df.schema();
    new Layout(schema); // fails here, on the driver, if a provenance column is missing
    FlatMapFunction<Iterator<InternalRow>, String> task =
        rows -> {
          if (!rows.hasNext()) {
            return Collections.emptyIterator(); // the driver advances G for this partition
          }
          TaskContext context = TaskContext.get();
          Batch batch =
              new Batch(
                  context.getLocalProperty(BATCH_PROPERTY),
                  context.getLocalProperty(SPARK_BATCH_PROPERTY));
          Settings settings = settings(settingsJson);
          return Collections.singletonList(
                  commit(settings, batch, new Layout(schema), rows))
              .iterator();
        };
    return df.queryExecution().toRdd().toJavaRDD().mapPartitions(task).collect();
  }

  /**
   * Take the ids of ``partitionsJson`` ([[topic, partition], ...]) over and read G for them,
   * in the background; returns at once. These are the first steps of every task (a new
   * producer's initTransactions, then G's stable offset, read after it), taken ahead of the
   * run's first batch: its tasks find the producer holding the id and c known for the run.
   * Called on the driver, after the runner's own take-over and only where the driver's JVM
   * runs the tasks. A task waits for its id's preparation; whatever fails here is left to the
   * tasks, which take the same steps when they find them not done.
   */
  public static void prepare(String settingsJson, String partitionsJson) throws Exception {
    Settings settings = settings(settingsJson);
    Map<TopicPartition, Slot> slots = new HashMap<>();
    List<CompletableFuture<?>> taken = new ArrayList<>();
    for (JsonNode entry : JSON.readTree(partitionsJson)) {
      TopicPartition tp = new TopicPartition(entry.get(0).asText(), entry.get(1).asInt());
      String id = settings.transactionalId(tp.topic(), tp.partition());
      Slot slot = SLOTS.computeIfAbsent(id, k -> new Slot());
      slots.put(tp, slot);
      taken.add(
          CompletableFuture.runAsync(
              () -> {
                synchronized (slot) {
                  // This run's take-over fenced any producer of the id: only another
                  // runner can fence this one, so its fencings count (lastRun).
                  held(slot, settings, id, true).lastRun = settings.run;
                }
              },
              PREPARING));
    }
    CompletableFuture<Void> done =
        CompletableFuture.allOf(taken.toArray(new CompletableFuture<?>[0]))
            .thenRunAsync(
                () -> {
                  Map<TopicPartition, Long> progress = committed(settings, slots.keySet());
                  slots.forEach(
                      (tp, slot) -> {
                        synchronized (slot) {
                          if (slot.held != null) {
                            slot.held.known.put(settings.run, progress.get(tp));
                          }
                        }
                      });
                },
                PREPARING)
            .exceptionally(
                e -> {
                  LOG.warn(
                      "preparing transactional ids {}.* failed, the tasks take them: {}",
                      settings.prefix,
                      e.getMessage());
                  return null;
                });
    slots.values().forEach(slot -> slot.prepared = done);
  }

  /** Close the producers of the ids ``<prefix>.*`` (a run that commits otherwise after all). */
  public static void release(String prefix) {
    SLOTS.forEach(
        (id, slot) -> {
          if (id.startsWith(prefix + ".")) {
            slot.prepared.join();
            synchronized (slot) {
              discard(slot);
            }
          }
        });
  }

  /** The offsets-only transaction for a partition no task reported on (called on the driver). */
  public static String advance(String settingsJson, String batchJson, String topic, int partition)
      throws Exception {
    Settings settings = settings(settingsJson);
    Batch batch = new Batch(batchJson, null);
    return transact(settings, batch, new TopicPartition(topic, partition), null, null);
  }

  static String commit(Settings settings, Batch batch, Layout layout, Iterator<InternalRow> rows)
      throws Exception {
    InternalRow first = rows.next().copy(); // rows may be reused by the iterator
    String topic = layout.topicOf(first, batch.topic);
    TopicPartition tp = new TopicPartition(topic, first.getInt(layout.sourcePartition));
    if (!batch.end.containsKey(tp)) {
      throw new TaskFailure(
          "PipelineFailed", "rows of " + tp + " are not in this batch's offsets " + batch.end, null);
    }
    return transact(settings, batch, tp, layout, new Rows(first, rows));
  }

  /** The task's rows: the first one (already read) and the rest. */
  static final class Rows {
    InternalRow first;
    final Iterator<InternalRow> rest;

    Rows(InternalRow first, Iterator<InternalRow> rest) {
      this.first = first;
      this.rest = rest;
    }

    InternalRow next() {
      if (first != null) {
        InternalRow row = first;
        first = null;
        return row;
      }
      return rest.hasNext() ? rest.next() : null;
    }
  }

  static String transact(
      Settings settings, Batch batch, TopicPartition tp, Layout layout, Rows rows)
      throws Exception {
    long until = batch.end.get(tp);
    String id = settings.transactionalId(tp.topic(), tp.partition());
    Slot slot = SLOTS.computeIfAbsent(id, k -> new Slot());
    slot.prepared.join(); // never fails: a failed preparation leaves its steps to the task
    int fenced = 0;
    synchronized (slot) {
      for (int attempt = 0; attempt < ATTEMPTS; attempt++) {
        Held held = held(slot, settings, id, attempt > 0);
        Long known = held.known.remove(settings.run); // put back only by a commit or a skip
        long committed =
            known != null ? known : committed(settings, Collections.singleton(tp)).get(tp);
        if (committed >= until) {
          held.known.put(settings.run, committed);
          drain(rows);
          return outcome(tp, "skipped", 0, 0.0, fenced);
        }
        long started = System.nanoTime();
        KafkaProducer<byte[], byte[]> producer = held.producer;
        try {
          producer.beginTransaction();
          // Offsets first: a producer fenced since its last use fails here, before any row.
          // The marker ends with a NUL byte, as confluent-kafka writes it (the librdkafka
          // producers of the Python path and the driver): confluent-kafka 2.16 reads a commit's
          // metadata as a C string, so metadata without one is read on into whatever memory
          // follows (seen: a runner's start failed decoding it as UTF-8).
          producer.sendOffsetsToTransaction(
              settings.forGroup(tp, until, batch.marker + "\0"),
              new ConsumerGroupMetadata(settings.group));
        } catch (ProducerFencedException | InvalidProducerEpochException e) {
          // Another holder took the id over. Within one run, that is another runner; a
          // producer left from an earlier run was fenced by this run's own take-over.
          if (held.lastRun.equals(settings.run)) {
            fenced++;
          }
          discard(slot);
          continue;
        } catch (IllegalStateException e) {
          // The producer is dead (its I/O thread stopped after a fatal error, e.g. its epoch
          // bumped when the broker aborted a transaction for its age): a new one takes over.
          LOG.warn("{}: a new producer replaces a dead one: {}", id, e.getMessage());
          discard(slot);
          continue;
        } catch (RuntimeException e) {
          abort(slot, held);
          throw failure(e, "adding the offsets of " + tp + " to the transaction of " + id);
        }
        Progress progress = new Progress(settings, batch, tp, committed, started);
        try {
          send(producer, settings.topic, layout, rows, progress);
          producer.commitTransaction();
        } catch (RuntimeException e) {
          TaskFailure failure = failure(e, "the transaction of " + id, progress.openedAt, settings);
          abort(slot, held);
          if (System.nanoTime() - progress.openedAt >= settings.timeoutMs * 1_000_000L) {
            discard(slot); // the broker bumped the id's epoch when it aborted the transaction
          }
          throw failure;
        }
        long out = progress.out;
        if (progress.transactions > 1) {
          LOG.info("{}: {} rows in {} transactions", id, out, progress.transactions);
        }
        held.lastRun = settings.run;
        held.known.put(settings.run, until);
        double ms = (System.nanoTime() - started) / 1e6;
        return outcome(tp, "committed", out, ms, fenced);
      }
    }
    throw new TaskFailure(
        "ProducerFenced",
        "transactional id '" + id + "' keeps being fenced: another runner of this pipeline is"
            + " writing",
        null);
  }

  /**
   * Where a task's transactions stand: the rows sent, the offset G was last moved to in this
   * task, the highest source offset sent, and when the open transaction began.
   */
  static final class Progress {
    final Settings settings;
    final Batch batch;
    final TopicPartition tp;
    /** Rows below this offset are visible already (G, then each intermediate commit). */
    long floor;
    /** Whether an intermediate commit moved G in this task (then no row may come below it). */
    boolean moved;
    long last = -1;
    long out;
    int transactions = 1;
    long openedAt;

    Progress(Settings settings, Batch batch, TopicPartition tp, long committed, long openedAt) {
      this.settings = settings;
      this.batch = batch;
      this.tp = tp;
      this.floor = committed;
      this.openedAt = openedAt;
    }
  }

  /**
   * Send the rows with offset >= G. A transaction open for a third of the transaction timeout
   * is committed with G at (highest source offset sent + 1), at the first row of a
   * higher offset (the output rows of one source record are never split), and the next begins
   * with {(t, p): until} first, as the first did. A replay then produces the rows from there
   * on, so a range of any length gets through (invariant 10). The clock is read every
   * ROWS_PER_CLOCK_CHECK rows.
   */
  static void send(
      KafkaProducer<byte[], byte[]> producer,
      String topic,
      Layout layout,
      Rows rows,
      Progress progress) {
    if (rows == null) {
      return;
    }
    TopicPartition tp = progress.tp;
    long due = progress.openedAt + progress.settings.commitAfterNanos;
    boolean overdue = false;
    int unchecked = 0;
    // Locals in the loop (the fast path), kept in progress at the end and at each commit.
    long floor = progress.floor;
    long last = progress.last;
    long out = 0;
    for (InternalRow row = rows.next(); row != null; row = rows.next()) {
      if (row.getInt(layout.sourcePartition) != tp.partition()
          || !layout.topicOf(row, tp.topic()).equals(tp.topic())) {
        throw new TaskFailure(
            "PipelineFailed",
            "partitioned commit mode needs one source partition per Spark task, but a task got"
                + " rows of " + tp + " and of " + layout.topicOf(row, tp.topic()) + "-"
                + row.getInt(layout.sourcePartition)
                + "; use commitMode coordinated for this query",
            null);
      }
      long offset = row.getLong(layout.sourceOffset);
      if (offset < floor) {
        if (progress.moved) {
          throw new TaskFailure(
              "PipelineFailed",
              "partitioned commit mode needs each task's rows in source offset order, but a row"
                  + " of " + tp + " at offset " + offset + " came after offset "
                  + floor + "; use commitMode coordinated for this query",
              null);
        }
        continue; // a replay: visible already
      }
      if (overdue && offset > last) {
        progress.last = last;
        commitSoFar(producer, progress);
        floor = progress.floor;
        due = progress.openedAt + progress.settings.commitAfterNanos;
        overdue = false;
      }
      producer.send(layout.record(topic, row));
      out++;
      last = Math.max(last, offset);
      if (++unchecked == ROWS_PER_CLOCK_CHECK) {
        unchecked = 0;
        overdue = System.nanoTime() >= due;
      }
    }
    progress.out = out;
    progress.last = last;
  }

  /** Commit the rows sent so far with G at the offset after the last one; begin the next. */
  static void commitSoFar(KafkaProducer<byte[], byte[]> producer, Progress progress) {
    // Not the batch's marker: a coordinated run of the checkpoint must not take G, short of
    // the batch end, for the batch done (PARTIAL_SUFFIX in Python).
    Settings settings = progress.settings;
    Map<TopicPartition, OffsetAndMetadata> upTo =
        settings.forGroup(progress.tp, progress.last + 1, progress.batch.marker + PARTIAL + "\0");
    ConsumerGroupMetadata group = new ConsumerGroupMetadata(settings.group);
    // The last offsets added for a partition in a transaction are the ones it commits.
    producer.sendOffsetsToTransaction(upTo, group);
    producer.commitTransaction();
    progress.floor = progress.last + 1;
    progress.moved = true;
    progress.transactions++;
    progress.openedAt = System.nanoTime();
    producer.beginTransaction();
    long until = progress.batch.end.get(progress.tp);
    producer.sendOffsetsToTransaction(
        settings.forGroup(progress.tp, until, progress.batch.marker + "\0"), group);
  }

  static void drain(Rows rows) {
    if (rows != null) {
      while (rows.next() != null) {
        // a replay: the rows are visible already
      }
    }
  }

  static Held held(Slot slot, Settings settings, String id, boolean fresh) {
    if (fresh && slot.held != null) {
      discard(slot);
    }
    if (slot.held == null) {
      Properties props = new Properties();
      props.putAll(settings.producer);
      props.put("transactional.id", id);
      KafkaProducer<byte[], byte[]> producer =
          new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer());
      try {
        producer.initTransactions(); // fences every older holder, aborts what it left open
      } catch (RuntimeException e) {
        producer.close(Duration.ZERO);
        throw failure(e, "taking transactional id " + id + " over");
      }
      // Where each id's producer lives: the driver in local mode, else an executor.
      SparkEnv env = SparkEnv.get();
      String executor = env == null ? "?" : env.executorId();
      LOG.info("{}: transactional producer in executor {}", id, executor);
      slot.held = new Held(producer);
    }
    return slot.held;
  }

  static void discard(Slot slot) {
    if (slot.held != null) {
      slot.held.producer.close(Duration.ZERO);
      slot.held = null;
    }
  }

  static void abort(Slot slot, Held held) {
    try {
      held.producer.abortTransaction();
    } catch (RuntimeException e) {
      discard(slot); // a fatal error: the next use builds a new producer (and fences this one)
    }
  }

  /** G's stable committed offsets for ``tps`` (-1 if none), read with read_committed. */
  static Map<TopicPartition, Long> committed(Settings settings, Set<TopicPartition> tps) {
    String key = settings.group + "\u0000" + settings.reader;
    synchronized (READERS) {
      KafkaConsumer<byte[], byte[]> reader = READERS.get(key);
      if (reader == null) {
        Properties props = new Properties();
        props.putAll(settings.reader);
        props.put("group.id", settings.group);
        props.put("isolation.level", "read_committed");
        props.put("enable.auto.commit", "false");
        reader =
            new KafkaConsumer<>(props, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        READERS.put(key, reader);
      }
      try {
        Map<TopicPartition, TopicPartition> stored = new HashMap<>();
        for (TopicPartition tp : tps) {
          stored.put(tp, settings.stored(tp));
        }
        Map<TopicPartition, OffsetAndMetadata> found =
            reader.committed(new HashSet<>(stored.values()));
        return tps.stream()
            .collect(
                Collectors.toMap(
                    tp -> tp,
                    tp -> {
                      OffsetAndMetadata at = found.get(stored.get(tp));
                      return at == null ? -1L : at.offset();
                    }));
      } catch (RuntimeException e) {
        reader.close(Duration.ZERO);
        READERS.remove(key);
        throw failure(e, "reading progress group " + settings.group + " for " + tps);
      }
    }
  }

  /**
   * As failure(e, what), but a transaction that was open longer than the transaction timeout
   * (opened at ``openedAt``, System.nanoTime) is reported as what happened to it: the broker
   * aborts such a transaction (eop_spark.contract.errors.after_transaction says the same).
   */
  static TaskFailure failure(RuntimeException e, String what, long openedAt, Settings settings) {
    long openMs = (System.nanoTime() - openedAt) / 1_000_000L;
    long timeoutMs = settings.timeoutMs;
    if (!(e instanceof KafkaException) || openMs < timeoutMs || brokerAway(e)) {
      return failure(e, what); // a broker away kept it open: the batch is not too big
    }
    return new TaskFailure(
        TIMED_OUT_KIND,
        what + " was open " + openMs + " ms, longer than sink.kafka.transactionTimeout ("
            + timeoutMs + " ms), and the broker aborts such a transaction: raise"
            + " sink.kafka.transactionTimeout or make batches smaller with"
            + " source.kafka.maxOffsetsPerTrigger (" + e.getClass().getSimpleName() + ": "
            + e.getMessage() + ")",
        e);
  }

  static TaskFailure failure(RuntimeException e, String what) {
    if (e instanceof TaskFailure) {
      return (TaskFailure) e;
    }
    String reason = what + ": " + e.getClass().getSimpleName() + ": " + e.getMessage();
    boolean fatal =
        e instanceof AuthorizationException
            || e instanceof AuthenticationException
            || e instanceof UnsupportedVersionException
            || !(e instanceof KafkaException);
    String kind = fatal ? "PipelineFailed" : brokerAway(e) ? BROKER_AWAY_KIND : "SinkRetryable";
    return new TaskFailure(kind, reason, e);
  }

  /**
   * Whether ``e`` or a cause is a retriable Kafka error (not enough in-sync replicas, a leader
   * or coordinator away, a timeout): a broker stayed away through the client's retries, and
   * the batch is retried for longer (eop_spark.exactly_once.retries).
   */
  static boolean brokerAway(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause() == t ? null : t.getCause()) {
      if (t instanceof RetriableException) {
        return true;
      }
    }
    return false;
  }

  static String outcome(TopicPartition tp, String status, long rows, double ms, int fenced) {
    ObjectNode node = JSON.createObjectNode();
    node.put("topic", tp.topic());
    node.put("partition", tp.partition());
    node.put("status", status);
    node.put("rows_out", rows);
    node.put("txn_ms", ms);
    node.put("fenced", fenced);
    node.put("aborted", 0);
    return node.toString();
  }
}
