# The quorum-node image: `quorum-node run` configured by QUORUM_* variables (the operator's pods),
# plus quorum-admin and quorum-client, and boto3 for backups to object storage (the s3 extra).
# Build from the repository root:
#   docker build -t ghcr.io/quorum-node/quorum-node:0.1.0 .
# (the name the chart, the CRD and the operator default to; README.md, "Kubernetes operator")
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY quorum_node ./quorum_node
COPY operator ./operator
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir '.[s3]'

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
# A fixed non-root user (the operator's pods run as 10001 with fsGroup 10001 on the volume).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /var/lib/quorum quorum \
    && mkdir -p /var/lib/quorum && chown 10001:10001 /var/lib/quorum
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001
EXPOSE 9093
ENTRYPOINT []
CMD ["quorum-node", "run"]
