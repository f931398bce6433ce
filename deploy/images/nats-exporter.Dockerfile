# deploy/nats-exporter (nats-server's /varz as Prometheus text). Two ways, as for
# deploy/Dockerfile:
# - from source where a registry serves the `golang` and `debian` images (the default
#   target; compose's `build:`), context deploy/nats-exporter;
# - `--target prebuilt` on the local base from a binary built outside with
#   `CGO_ENABLED=0 go build` (deploy/images.sh), context a folder holding only
#   `nats-exporter`.
ARG GO_VERSION=1.22
ARG DEBIAN_RELEASE=bookworm
ARG BASE_IMAGE=debian:${DEBIAN_RELEASE}-slim

FROM golang:${GO_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
RUN CGO_ENABLED=0 go build -o /usr/local/bin/nats-exporter .

FROM ${BASE_IMAGE} AS runtime-base
EXPOSE 7777
ENTRYPOINT ["nats-exporter"]

FROM runtime-base AS prebuilt
COPY nats-exporter /usr/local/bin/nats-exporter
USER nobody

FROM runtime-base AS runtime
COPY --from=build /usr/local/bin/nats-exporter /usr/local/bin/nats-exporter
USER nobody
