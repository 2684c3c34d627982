# tallyd (and tallyctl): a small Debian image without LibTorch. The build
# stage runs the same steps as `make` (scripts/setup.sh, then CMake); build
# from the repository root:
#   docker build -f deploy/docker/tallyd.Dockerfile -t tally/tallyd:0.1.0 .
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends make sudo ca-certificates \
 && scripts/setup.sh && cmake --build build --target tallyd tallyctl

FROM debian:12-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libsqlite3-0 libcivetweb1 \
      libyaml-cpp0.7 libspdlog1.10 libfmt9 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home tally \
 && mkdir -p /var/lib/tally && chown tally:tally /var/lib/tally
COPY --from=build /src/build/server/tallyd /src/build/cli/tallyctl /usr/local/bin/
COPY examples/tallyd.yaml /etc/tally/tallyd.yaml
USER 10001:10001
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/tallyd"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--data_dir=/var/lib/tally", \
     "--config=/etc/tally/tallyd.yaml"]
