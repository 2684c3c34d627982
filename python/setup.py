"""Builds the tally package. The message and service modules (tally/v1) are
generated here from the repository's proto/ by grpcio-tools' protoc, every
time the package is built, so they always match the API tallyd serves.
TALLY_PROTO_DIR names another proto/ folder (e.g. when building from a copy
of python/ alone)."""

import os
import shutil
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["tally/v1/spec.proto", "tally/v1/jobs.proto", "tally/v1/experiments.proto",
          "tally/v1/workers.proto", "tally/v1/auth_config.proto"]


def generate_stubs() -> None:
    proto_dir = os.environ.get("TALLY_PROTO_DIR") or os.path.join(HERE, "..", "proto")
    out_pkg = os.path.join(HERE, "tally", "v1")
    if not os.path.isfile(os.path.join(proto_dir, PROTOS[0])):
        if os.path.isfile(os.path.join(out_pkg, "jobs_pb2.py")):
            return  # a source distribution: generated when it was made
        sys.exit("tally: no proto/ at %s; set TALLY_PROTO_DIR to the repository's proto folder"
                 % proto_dir)
    import grpc_tools
    from grpc_tools import protoc

    shutil.rmtree(out_pkg, ignore_errors=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["grpc_tools.protoc", "--proto_path=" + proto_dir, "--proto_path=" + well_known,
            "--python_out=" + HERE, "--pyi_out=" + HERE, "--grpc_python_out=" + HERE] + PROTOS
    if protoc.main(args) != 0:
        sys.exit("tally: protoc failed on %s" % proto_dir)
    with open(os.path.join(out_pkg, "__init__.py"), "w") as f:
        f.write('"""Messages and service stubs generated from proto/tally/v1 at build time."""\n')


generate_stubs()
setup()
