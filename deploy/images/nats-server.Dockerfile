# nats-server on the local base, from a binary built outside (the `go install`ed one
# scripts/test.sh puts in $(go env GOPATH)/bin): deploy/images.sh builds it with a
# context folder holding only `nats-server`.
ARG BASE_IMAGE=shaddock-base:bookworm
FROM ${BASE_IMAGE}
COPY nats-server /usr/local/bin/nats-server
RUN useradd --system --uid 10002 --no-create-home nats
USER nats
RUN ["nats-server", "--version"]
# 4222 clients, 6222 cluster routes, 8222 HTTP monitoring.
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
