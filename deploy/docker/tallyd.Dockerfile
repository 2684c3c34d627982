# tallyd (and tallyctl): a small Debian image without LibTorch. The build
# stage runs the same steps as `make` (scripts/setup.sh, then CMake), then
# deploy/docker/stage-runtime.sh stages the two binaries and lists the
# packages they need; the final stage copies only that (no sources, build
# tree, LibTorch or kubectl venv). Build from the repository root:
#   docker build -f deploy/docker/tallyd.Dockerfile -t tally/tallyd:0.1.0 .
#
# This image has not been built: the machine these files were written on
# has the Docker client but no Docker daemon (nor podman or buildah).
#
# In Kubernetes the root filesystem is read-only: SQLite keeps its temporary
# tables in memory (temp_store=MEMORY), the database lives on the volume at
# /var/lib/tally and /tmp is an emptyDir (deploy/k8s/base/tallyd.yaml).
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends make sudo ca-certificates \
 && scripts/setup.sh && cmake --build build --target tallyd tallyctl \
 && deploy/docker/stage-runtime.sh /stage build/server/tallyd build/cli/tallyctl \
 && cat /stage/files.txt

FROM debian:12-slim
COPY --from=build /stage/packages.txt /tmp/packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/packages.txt env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt \
 && useradd --uid 10001 --user-group --no-create-home tally \
 && mkdir -p /var/lib/tally && chown tally:tally /var/lib/tally
COPY --from=build /stage/root/ /
COPY examples/tallyd.yaml /etc/tally/tallyd.yaml
USER 10001:10001
EXPOSE 50051 9464
# Served beyond loopback, tallyd needs TLS, user tokens and worker
# authentication (it refuses to start without them): the same paths as in
# deploy/k8s/base/tallyd.yaml, mounted read-only and readable by uid 10001,
# e.g. from scripts/dev-pki.sh's directory ~/tally-pki (which it writes
# 0600: make the four files readable by uid 10001 first):
#   docker run -p 50051:50051 \
#     -v "$HOME/tally-pki/tallyd.crt:/var/run/tally/tls/tls.crt:ro" \
#     -v "$HOME/tally-pki/tallyd.key:/var/run/tally/tls/tls.key:ro" \
#     -v "$HOME/tally-pki/ca.crt:/var/run/tally/tls/ca.crt:ro" \
#     -v "$HOME/tally-pki/users.yaml:/var/run/tally/auth/users.yaml:ro" tally/tallyd:0.1.0
ENTRYPOINT ["/usr/local/bin/tallyd"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--data_dir=/var/lib/tally", \
     "--config=/etc/tally/tallyd.yaml", \
     "--tls_cert=/var/run/tally/tls/tls.crt", "--tls_key=/var/run/tally/tls/tls.key", \
     "--client_ca=/var/run/tally/tls/ca.crt", "--auth_tokens=/var/run/tally/auth/users.yaml"]
