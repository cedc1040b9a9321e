# The control-plane image: api, trainer, lcm and the job monitor pods (python3 -m trainforge_services.<name>).
# Build from the repository root:  docker build -f deploy/docker/platform.Dockerfile -t trainforge/platform:0.1.0 .
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/trainforge
COPY requirements/runtime.lock requirements/runtime.lock
RUN python3 -m pip install -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY protos protos
COPY services services
COPY frameworks frameworks
COPY trainforge trainforge
RUN python3 -m pip install --no-deps --no-build-isolation . \
 && groupadd --gid 1000 trainforge && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /tmp trainforge \
 && mkdir -p /var/lib/trainforge && chown 1000:1000 /var/lib/trainforge
# the chart and the pods the LCM creates run it read-only, as this user, with /tmp and the state dir as emptyDirs
USER 1000:1000
ENV HOME=/tmp TF_STATE_DIR=/var/lib/trainforge
CMD ["python3", "-m", "trainforge_services.api"]
