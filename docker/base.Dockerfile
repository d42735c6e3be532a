# The durable-rollouts base image: the OS image from make-base-image.sh plus a venv holding this
# package and the env server's libraries. Built by docker/make-base-image.sh from a context that
# holds wheels/ (prepared by the host's pip) and rollouts-env; nothing is fetched during the build.
ARG OS_IMAGE=durable-rollouts-os:bookworm
FROM ${OS_IMAGE}

COPY wheels/ /tmp/wheels/
COPY rollouts-env /usr/local/bin/rollouts-env
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install -q --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl \
 && /opt/venv/bin/python -c "import durable_rollouts.envserver" \
 && rm -rf /tmp/wheels \
 && chmod 0755 /usr/local/bin/rollouts-env \
 && echo 'rollouts:x:10001:10001:durable-rollouts env:/tmp:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'rollouts:x:10001:' >>/etc/group

# HOME on /tmp: the runtime mounts a tmpfs there and keeps the root file system read-only.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    ROLLOUTS_HOME=/tmp/rollouts
CMD ["/bin/bash"]
