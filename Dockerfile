# One image for every fleet-rlm service; the command picks the service.
# Installs exactly the hashed lock, then the workspace members without dependencies.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends util-linux git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.lock ./
RUN python -m pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock
COPY libs libs
COPY services services
RUN python -m pip install --no-cache-dir --no-deps --no-build-isolation \
    -e libs/events -e libs/mesh -e libs/harness -e apps/cli \
    -e services/gateway -e services/agent -e services/sandbox-broker \
    -e services/budget -e services/quality
ENV PYTHONUNBUFFERED=1
