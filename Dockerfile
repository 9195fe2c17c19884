# The two eop images, built from one source tree:
#
#   --target operator   the kopf operator (`eop operator`): Python only, no JVM
#   --target spark      a pipeline driver (`eop run`): Python + pyspark + Java 17 + the Kafka and
#                       S3A jars
#
# BASE_IMAGE is any Debian bookworm image, e.g. docker.io/library/debian:bookworm-slim.
# The default names the one devenv/images.sh makes with debootstrap, because the local
# environment reaches no container registry.
#
#   devenv/images.sh                        # buildah, cached, prints the image refs
#   docker build --target operator -t eop-operator --build-arg BASE_IMAGE=debian:bookworm-slim .
#
# Behind a TLS-inspecting proxy, hand the build its CA bundle as a secret (never stored in a
# layer): --secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt
ARG BASE_IMAGE=localhost/debian-base:bookworm

# ---------------------------------------------------------------------------------------------
# Shared by every stage and both images: Debian's python3 and the unprivileged user.
FROM ${BASE_IMAGE} AS runtime-base
# An ARG, not ENV: apt's non-interactive mode is for the build only. Each stage that runs apt
# declares it again (ARGs end with their stage).
ARG DEBIAN_FRONTEND=noninteractive
ENV LANG=C.UTF-8
# uid/gid 1000 get a passwd entry: the JVM (Hadoop's UserGroupInformation) fails for a uid
# without a name. HOME is /tmp so a read-only root filesystem plus a /tmp emptyDir suffices.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && groupadd --gid 1000 eop \
    && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin eop
ENV HOME=/tmp \
    PATH=/opt/eop/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# ---------------------------------------------------------------------------------------------
# Python build stages. Dependencies are installed from pyproject.toml alone, before the source
# is copied, so a source change reuses the (large) dependency layers.
FROM runtime-base AS builder
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && python3 -m venv /opt/eop/venv
# The pip cache is a build cache mount (HOME is /tmp, so name it); PEP 517 builds make pyspark's
# sdist into a wheel that the cache keeps for the next rebuild.
ENV PIP_CACHE_DIR=/var/cache/pip \
    PIP_USE_PEP517=1
WORKDIR /src

# requirements-<extra>.txt = the base dependencies plus one extra, read from pyproject.toml.
# Each venv stage copies only its own file, so e.g. a new spark dependency leaves the operator
# venv's layers cached.
FROM builder AS requirements
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; \
p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
[open(f"requirements-{e}.txt", "w").write("\n".join(p["dependencies"] + p["optional-dependencies"][e]) + "\n") \
 for e in ("operator", "spark")]'

FROM builder AS venv-operator
COPY --from=requirements /src/requirements-operator.txt ./
RUN --mount=type=secret,id=build-ca \
    --mount=type=cache,target=/var/cache/pip,sharing=locked \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
    && pip install --requirement requirements-operator.txt

FROM builder AS venv-spark
COPY --from=requirements /src/requirements-spark.txt ./
RUN --mount=type=secret,id=build-ca \
    --mount=type=cache,target=/var/cache/pip,sharing=locked \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
    && pip install --requirement requirements-spark.txt

# The eop distribution itself (both packages; the extras only decide the dependencies).
FROM builder AS wheel
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY spark_apps ./spark_apps
RUN --mount=type=secret,id=build-ca \
    --mount=type=cache,target=/var/cache/pip,sharing=locked \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
    && pip wheel --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------
# The Spark Kafka connector and its dependencies, and Hadoop's S3A connector for checkpoints in
# object storage (in /opt/eop/jars/s3a: on the classpath only of drivers whose checkpoint is at
# an s3a:// URI), fetched by the same script the dev environment uses. It leaves out the jars
# pyspark already ships, which it learns from the spark venv (hence this stage builds on it; it
# is thrown away, only /opt/eop/jars leaves it).
FROM venv-spark AS jars
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY devenv/fetch-jars.sh devenv/versions.env /src/devenv/
# The CA bundle goes into this stage's Java truststore (one file per certificate is what
# update-ca-certificates and its Java hook expect). Maven's repository is a cache mount: the JVM
# takes user.home from the passwd entry (/root), not from HOME.
RUN --mount=type=secret,id=build-ca \
    --mount=type=cache,target=/root/.m2,sharing=locked \
    set -eu \
    && . /src/devenv/versions.env \
    && pyspark_version="$(python -c 'import importlib.metadata as m; print(m.version("pyspark"))')" \
    && if [ "$pyspark_version" != "$SPARK_VERSION" ]; then \
         echo "pyspark $pyspark_version (pyproject.toml) != SPARK_VERSION $SPARK_VERSION (versions.env)" >&2; \
         exit 1; \
       fi \
    && if [ -s /run/secrets/build-ca ]; then \
         awk '/BEGIN CERTIFICATE/ { n++ } n { print > ("/usr/local/share/ca-certificates/build-ca-" n ".crt") }' \
           /run/secrets/build-ca \
         && update-ca-certificates >/dev/null 2>&1; \
       fi \
    && jars_dir="$(EOP_CACHE=/opt/eop/cache PYTHON=/opt/eop/venv/bin/python /src/devenv/fetch-jars.sh spark)" \
    && mkdir -p /opt/eop/jars \
    && cp "$jars_dir"/*.jar /opt/eop/jars/ \
    && s3a_dir="$(EOP_CACHE=/opt/eop/cache PYTHON=/opt/eop/venv/bin/python /src/devenv/fetch-jars.sh s3a)" \
    && mkdir -p /opt/eop/jars/s3a \
    && cp "$s3a_dir"/*.jar /opt/eop/jars/s3a/
# The partitioned sink's JVM task (eop_spark.exactly_once.partitioned.jvm_writer), compiled
# against those jars and pyspark's with this stage's JDK (the image has a JRE only).
COPY spark_apps/eop_spark/exactly_once/partitioned/jvm_writer.py \
     spark_apps/eop_spark/exactly_once/partitioned/PartitionedWriter.java /src/jvm_writer/
RUN python /src/jvm_writer/jvm_writer.py /opt/eop/jars /opt/eop/jars

# ---------------------------------------------------------------------------------------------
# Image: the operator. The eop wheel is installed on top of the dependency venv in layers of
# their own, so a source change ships a few hundred kilobytes.
FROM runtime-base AS operator
LABEL org.opencontainers.image.title="eop-operator" \
      org.opencontainers.image.description="Kubernetes operator for exactly-once PySpark pipelines from Kafka" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=venv-operator /opt/eop/venv /opt/eop/venv
# (COPY, not RUN --mount=from: buildah 1.28 may unmount a stage only a mount refers to.)
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps --no-index /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["eop"]
CMD ["operator", "--all-namespaces"]

# ---------------------------------------------------------------------------------------------
# Image: a pipeline driver (and executor) running `eop run`.
FROM runtime-base AS spark
LABEL org.opencontainers.image.title="eop-spark" \
      org.opencontainers.image.description="PySpark runtime of eop pipelines (eop run)" \
      org.opencontainers.image.licenses="Apache-2.0"
# The JRE's postinst registers man pages with update-alternatives, which fails on slim bases
# that drop /usr/share/man; creating the directory keeps any bookworm base working.
ARG DEBIAN_FRONTEND=noninteractive
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/hsperfdata_root \
    && install -d -o 1000 -g 1000 -m 0775 /opt/eop/work
COPY --from=jars /opt/eop/jars /opt/eop/jars
COPY --from=venv-spark /opt/eop/venv /opt/eop/venv
# (COPY, not RUN --mount=from: buildah 1.28 may unmount a stage only a mount refers to.)
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir --no-deps --no-index /tmp/wheels/*.whl && rm -rf /tmp/wheels
ENV EOP_SPARK_JARS=/opt/eop/jars
# A class-data-sharing archive of the classes a session and its first query load: a restarted
# driver's JVM maps it and starts seconds sooner (eop_spark.speedups.class_archive). Built by a
# short training run of this very JVM and these jars, so it fits them; world-readable for uid 1000.
RUN python -m eop_spark.runtime.class_archive_training /opt/eop/spark-classes.jsa \
    && chmod 0644 /opt/eop/spark-classes.jsa \
    && rm -rf /tmp/* /tmp/.[!.]*
USER 1000:1000
WORKDIR /opt/eop/work
ENTRYPOINT ["eop"]
CMD ["run", "--config", "/etc/eop/run.json"]
