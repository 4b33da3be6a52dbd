"""Build hook of the warmpool Python client.

The wire protocol's single source is ``ipc/warmpool.proto`` at the repository root. Building the
package (``pip install ./python``, a wheel, an editable install) runs ``protoc --python_out`` on it
and puts the generated ``warmpool_pb2.py`` into the package; no generated file is kept in the
source tree.

There is deliberately no pyproject.toml: pip then builds with the setuptools and wheel it finds
(Debian's python3-setuptools and python3-wheel) instead of fetching them from PyPI into an
isolated build environment, so that a plain ``pip install ./python`` works offline.

Environment:
  WARMPOOL_PROTO   the .proto file to compile (default: ../ipc/warmpool.proto beside this file)
  WARMPOOL_PROTOC  the protoc to run (default: protoc on PATH; Debian: apt-get install protobuf-compiler)
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO = os.path.join(HERE, os.pardir, "ipc", "warmpool.proto")
GENERATED = "warmpool_pb2.py"


class BuildError(RuntimeError):
    """Raised when warmpool_pb2.py cannot be generated; the message says what to do."""


def find_proto():
    proto = os.path.abspath(os.environ.get("WARMPOOL_PROTO") or DEFAULT_PROTO)
    if not os.path.isfile(proto):
        raise BuildError(
            f"warmpool: the protocol definition {proto} is missing. Build the package from a "
            "checkout of the warmpool repository (pip install --no-build-isolation ./python, run "
            "at the repository root), or point WARMPOOL_PROTO at ipc/warmpool.proto."
        )
    return proto


def find_protoc():
    wanted = os.environ.get("WARMPOOL_PROTOC") or "protoc"
    protoc = shutil.which(wanted)
    if protoc is None:
        raise BuildError(
            f"warmpool: '{wanted}' was not found, and it is needed to generate {GENERATED} from "
            "ipc/warmpool.proto. Install it (Debian: sudo apt-get install protobuf-compiler) or "
            "set WARMPOOL_PROTOC to its path."
        )
    return protoc


def generate_pb2(out_dir):
    """Runs protoc on the protocol definition, writing out_dir/warmpool_pb2.py."""
    proto = find_proto()
    protoc = find_protoc()
    os.makedirs(out_dir, exist_ok=True)
    command = [protoc, f"--proto_path={os.path.dirname(proto)}", f"--python_out={out_dir}", proto]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(
            f"warmpool: {' '.join(command)} failed (exit status {result.returncode}):\n{result.stderr}"
        )
    # protoc names the output after the .proto file; the package imports it as warmpool_pb2.
    produced = os.path.join(out_dir, os.path.splitext(os.path.basename(proto))[0] + "_pb2.py")
    target = os.path.join(out_dir, GENERATED)
    if produced != target:
        os.replace(produced, target)
    return target


class BuildPyWithProto(build_py):
    """build_py that also generates warmpool/warmpool_pb2.py from the protocol definition."""

    def run(self):
        if not getattr(self, "editable_mode", False):
            # pip builds in this tree: start from an empty build/lib/warmpool, so that a module
            # removed or renamed since the last build never lands in the wheel.
            shutil.rmtree(os.path.join(self.build_lib, "warmpool"), ignore_errors=True)
        super().run()
        # An editable install imports the package from the source tree, so the module goes there
        # (python/.gitignore keeps it out of git); otherwise into the build directory.
        if getattr(self, "editable_mode", False):
            out_dir = os.path.join(HERE, "warmpool")
        else:
            out_dir = os.path.join(self.build_lib, "warmpool")
        self.announce(f"generating {GENERATED} in {out_dir}", level=2)
        generate_pb2(out_dir)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, "warmpool", GENERATED))
        return outputs


def long_description():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        return f.read()


setup(
    name="warmpool",
    version="0.1.0",
    description="Python client of warmpoold, the warmpool local multi-model inference supervisor",
    long_description=long_description(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # Debian 12: python3-numpy (1.24) and python3-protobuf (3.21, which calls itself 4.21).
    install_requires=["numpy>=1.21", "protobuf>=3.20"],
    packages=["warmpool"],
    cmdclass={"build_py": BuildPyWithProto},
)
