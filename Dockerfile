# A durable-rollouts worker image built from this repository.
#
# No registry is needed: the default base is the OS image of docker/make-base-image.sh (Debian
# bookworm + python3 + venv); any image with python3 (>= 3.11) and venv works (BASE_IMAGE).
# The package and its dependencies install from ./wheelhouse when it exists (prepare it with
# `python -m pip wheel -w wheelhouse .`, so the build needs no package index), else from the
# index the build can reach.
#
#   docker/make-base-image.sh --os-only
#   python -m pip wheel -w wheelhouse .
#   DOCKER_BUILDKIT=0 docker build -t durable-rollouts-worker .
ARG BASE_IMAGE=durable-rollouts-os:bookworm
FROM ${BASE_IMAGE}

COPY . /src
RUN python3 -m venv /opt/rollouts \
 && if [ -d /src/wheelhouse ]; then \
      /opt/rollouts/bin/pip install -q --no-cache-dir --no-index --find-links /src/wheelhouse durable-rollouts; \
    else \
      /opt/rollouts/bin/pip install -q --no-cache-dir /src; \
    fi \
 && /opt/rollouts/bin/python -c "import durable_rollouts.worker" \
 && rm -rf /src \
 && mkdir -p /var/lib/durable-rollouts \
 && echo 'rollouts:x:10001:10001:durable-rollouts worker:/var/lib/durable-rollouts:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'rollouts:x:10001:' >>/etc/group \
 && chown 10001:10001 /var/lib/durable-rollouts

# Traces and substrate state; share this directory between workers (docker-compose.yml mounts
# one volume into every worker) so any worker can read a trace another one stored.
ENV PATH=/opt/rollouts/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    ROLLOUTS_HOME=/var/lib/durable-rollouts \
    HOME=/var/lib/durable-rollouts
USER rollouts
WORKDIR /var/lib/durable-rollouts
ENTRYPOINT ["python", "-m", "durable_rollouts.worker"]
# The Temporal address comes from ROLLOUTS_TEMPORAL_ADDRESS or --temporal HOST:PORT.
CMD ["--host-queue", "auto"]
