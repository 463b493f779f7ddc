# Kamailio from Debian bookworm (5.6, the version deploy/install-test-peers.sh installs), for
# compose.yaml and the Kubernetes manifests; the configuration is mounted, not baked in.
#   docker build -f deploy/docker/kamailio.Dockerfile -t appbridge-kamailio:5.6 deploy/docker
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends kamailio \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /run/kamailio
EXPOSE 5060/udp 5060/tcp
STOPSIGNAL SIGTERM
ENTRYPOINT ["kamailio", "-DD", "-E", "-f", "/etc/kamailio/kamailio.cfg"]
