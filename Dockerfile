# syntax=docker/dockerfile:1
#
# Multi-stage build: compile a static binary with the Go toolchain image,
# run it on a slim Debian as an unprivileged user. The image has no Postgres
# server: give it BULWARK_DATABASE_URL (docker-compose.yml does). It has
# pg_dump and pg_restore of PG_MAJOR, the major version of that server, so
# that `bulwark backup` and `bulwark restore` run inside it:
#
#   docker build --build-arg PG_MAJOR=16 .
#
# pg_dump refuses a server newer than itself; keep PG_MAJOR at the server's
# (docker-compose.yml passes the version of its postgres image).

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so that a source change does not re-download them.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# CGO_ENABLED=0: a static binary that needs nothing from the runtime image.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
        -o /out/bulwark ./cmd/bulwark

FROM debian:bookworm-slim
ARG PG_MAJOR=15
# ca-certificates: outgoing HTTPS (PLC directory, app view, relays).
# postgresql-client-N: pg_dump and pg_restore, in /usr/lib/postgresql/N/bin.
# Debian bookworm carries PostgreSQL 15; another major comes from the
# PostgreSQL project's apt repository, which postgresql-common's script
# sets up with the signing key it ships.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && if [ "${PG_MAJOR}" != 15 ]; then \
        apt-get install -y --no-install-recommends postgresql-common \
        && /usr/share/postgresql-common/pgdg/apt.postgresql.org.sh -y; \
    fi \
    && apt-get install -y --no-install-recommends "postgresql-client-${PG_MAJOR}" \
    && /usr/lib/postgresql/${PG_MAJOR}/bin/pg_dump --version \
    && /usr/lib/postgresql/${PG_MAJOR}/bin/pg_restore --version \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 bulwark \
    && useradd --system --uid 10001 --gid bulwark --home-dir /data --no-create-home \
        --shell /usr/sbin/nologin bulwark \
    && mkdir -p /data \
    && chown bulwark:bulwark /data \
    && chmod 0700 /data
COPY --from=build /out/bulwark /usr/local/bin/bulwark

USER bulwark:bulwark
ENV BULWARK_LISTEN=0.0.0.0:2583 \
    BULWARK_DATA_DIR=/data \
    BULWARK_LOG_FORMAT=json \
    BULWARK_PG_BIN_DIR=/usr/lib/postgresql/${PG_MAJOR}/bin
# Blobs and (when not set by the environment) generated secrets live here.
VOLUME ["/data"]
EXPOSE 2583
ENTRYPOINT ["/usr/local/bin/bulwark"]
CMD ["serve"]
