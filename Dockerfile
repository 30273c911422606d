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
# A non-root user, 10001, of group 0 (root's group, which grants nothing by itself): the image
# runs as well under any uid with gid 0, as OpenShift's restricted SCC runs it, its home the
# group's too. The operator's pods run as 10001, group and fsGroup 10001, unless the platform
# assigns its own (KQ_OPERATOR_POD_IDS=platform).
RUN useradd --uid 10001 --gid 0 --no-create-home --home-dir /var/lib/quorum quorum \
    && mkdir -p /var/lib/quorum && chown 10001:0 /var/lib/quorum && chmod 0770 /var/lib/quorum
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001
EXPOSE 9093
ENTRYPOINT []
CMD ["quorum-node", "run"]
