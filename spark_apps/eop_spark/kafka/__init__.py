"""The Kafka clients: client settings, the transactional producer, the checks before Spark starts.

* :mod:`.client_config`: librdkafka and Java client settings from the spec and
  mounted Secrets (SASL as JAAS, PEM for TLS);
* :mod:`.transactional_producer`: a confluent-kafka transactional producer with
  the error handling its documentation prescribes, and a place to plug in a
  faster way to queue Arrow columns;
* :mod:`.preflight`: brokers reachable, topics present, a cluster's id.

Knows nothing of the progress group's protocol: that is :mod:`eop_spark.exactly_once`.
"""
