# Template for an environment image: one directory holding env.py (and whatever it needs),
# served on 0.0.0.0:$ROLLOUTS_ENV_PORT (8765) with the token from ROLLOUTS_ENV_TOKEN.
#
#   docker/make-base-image.sh                       # once per machine: the base image
#   DOCKER_BUILDKIT=0 docker build -f docker/env.Dockerfile \
#       --build-arg ENV_DIR=examples/letters -t letters-env .
#
# Extra Python packages: put requirements.txt and their wheels (wheels/) in ENV_DIR; they are
# installed offline, so the build needs no package index.
ARG BASE_IMAGE=durable-rollouts-base:latest
FROM ${BASE_IMAGE}

ARG ENV_DIR=.
ARG ENV_FILE=env.py
COPY ${ENV_DIR}/ /app/
RUN if [ -f /app/requirements.txt ]; then \
      pip install -q --no-cache-dir --no-index --find-links /app/wheels -r /app/requirements.txt; \
    fi \
 && chmod -R a+rX /app

ENV ROLLOUTS_ENV_FILE=/app/${ENV_FILE} \
    ROLLOUTS_ENV_PORT=8765
USER rollouts
WORKDIR /app
EXPOSE 8765
ENTRYPOINT ["rollouts-env"]
