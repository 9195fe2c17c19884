"""The partitioned commit mode: one transaction per source partition, inside Spark tasks.

For record-wise queries each Spark task of a micro-batch reads exactly one
source topic-partition, and commits that partition's output and G's offset
for it in one transaction of ``<prefix>.<topic>.<partition>``; the driver
then commits G for the partitions no task reported on, so that after every
completed batch G equals the batch's end offsets.  The four steps of a task,
and why they are safe, are in :mod:`.task`.

Where a task runs its steps, decided per run (the JVM or Python) and, on the
Python paths, per task:

==========================  ========================================  ==============================
task path                   runs when                                 why it exists
==========================  ========================================  ==============================
the executor's JVM, with    by default: the session has the writer's  the rows never leave the JVM
the Java producer           jar (built from the Java source on first  (no Arrow batches, no Python
(PartitionedWriter.java;    use, or in the image), the run may        worker, no librdkafka): the
JvmTasks in driver.py,      commit partitioned, and every security    fastest path, ~0.9 of the rate
jvm_writer.py)              setting of the sink has a Java client     of Spark's own sink
                            equivalent (EOP_NO_JVM_WRITER=1 turns it
                            off)

a Python worker, through    fallback: no JVM writer, the executor's   one producer per transactional
the executor's producer     worker daemon started a hub (unless       id for the executor's life,
hub                         EOP_NO_PRODUCER_HUB or                    whichever worker runs the
(speedups/producer_hub.py)  EOP_NO_WORKER_DAEMON is set), and the     task: no init_transactions per
                            task's first Arrow batch is under 4 MiB   task when Spark moves a
                                                                      partition between workers

a Python worker, with its   fallback: no JVM writer, and no hub to    always available; for big
own librdkafka producer     reach or a first Arrow batch of 4 MiB or  tasks, copying every byte
(task.commit_partition)     more                                      through the hub's socket costs
                                                                      more than the id changing
                                                                      hands
==========================  ========================================  ==============================

Every path runs the same four steps with the same transactional ids, so they
fence each other like any two holders of an id, and which one runs never
changes what is committed.  The hub is a speed-up the runner plugs in (the
task function's ``hand_off``, see :class:`.task.TaskHandOff`); on both Python
paths the producers queue Arrow columns through the Arrow path the runner
gives them (:mod:`eop_spark.speedups.native_produce`), else through ``produce()``.
``.venv/bin/python -m bench.speedups`` measures each path, and each speed-up of
the Python paths, side by side (docs/performance.md, "Python tasks").

In local mode, where the driver's JVM runs the tasks, the JVM writer takes a
run's ids and reads G for them while the query starts (``JvmTasks.prepare``):
the first two steps of the first batch's tasks, in the same order.

Modules: :mod:`.driver` (the foreachBatch body: runs the batch's tasks, then
the offsets-only commits), :mod:`.task` (a task's steps in a Python process),
:mod:`.jvm_writer` (the JVM writer's jar and client settings).
"""
