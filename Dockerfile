# syntax=docker/dockerfile:1
#
# Multi-stage build: compile a static binary with the Go toolchain image,
# run it on a slim Debian as an unprivileged user. The image has no Postgres:
# give it BULWARK_DATABASE_URL (docker-compose.yml does).

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
# ca-certificates: outgoing HTTPS (PLC directory, app view, relays).
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
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
    BULWARK_LOG_FORMAT=json
# Blobs and (when not set by the environment) generated secrets live here.
VOLUME ["/data"]
EXPOSE 2583
ENTRYPOINT ["/usr/local/bin/bulwark"]
CMD ["serve"]
