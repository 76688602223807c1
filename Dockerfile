# The `cdc` service of docker-compose.yml: the toolkit with its Python env and JVM jars.
FROM python:3.11.7-slim-bookworm
ENV DEBIAN_FRONTEND=noninteractive \
    CDC_SKIP_SERVERS=1 \
    PYTHON=python3
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless maven make procps gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/cdc
COPY . .
# Same set-up as on a machine (venv from requirements.lock, jars from Maven Central), minus the
# PostgreSQL/Redis servers: in compose they are their own containers.
RUN scripts/setup.sh
ENV PATH=/opt/cdc/.venv/bin:$PATH
VOLUME /var/lib/cdc
ENTRYPOINT ["cdc"]
CMD ["run", "pipelines/examples/shop.yml"]
