# Prometheus from Debian's `prometheus` package, on the local base. deploy/images.sh
# downloads the package and whatever it needs that the base lacks (apt, inside the
# base's debootstrap root) into the context folder: this installs those .deb files, with
# no network, from a bind mount (so they are not left in a layer).
ARG BASE_IMAGE=shaddock-base:bookworm
FROM ${BASE_IMAGE}
# policy-rc.d: no service is started while installing (there is no init here).
RUN --mount=type=bind,target=/tmp/debs \
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d \
    && chmod 0755 /usr/sbin/policy-rc.d \
    && dpkg -i /tmp/debs/*.deb \
    && rm /usr/sbin/policy-rc.d \
    && prometheus --version
USER prometheus
WORKDIR /var/lib/prometheus
EXPOSE 9090
ENTRYPOINT ["prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml"]
