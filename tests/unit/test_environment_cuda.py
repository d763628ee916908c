"""``hvdtrain env``'s "cuda builds" line: each framework's CUDA build read from its version files."""

from hvdtrain.tools import environment


def test_cuda_builds_are_read_from_the_frameworks_version_files():
    # the texts as torch 2.13.0's PyPI CUDA wheel and TensorFlow's CUDA build write them
    assert environment.torch_cuda("__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n") == "CUDA 13.0"
    assert environment.torch_cuda("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n") == "CPU only"
    gpu_tf = "build_info = collections.OrderedDict([('cuda_version', '12.5.1'), ('cudnn_version', '9'), ('is_cuda_build', True)])"
    assert environment.tensorflow_cuda(gpu_tf) == "CUDA 12.5.1"
    assert environment.tensorflow_cuda("build_info = collections.OrderedDict([('is_cuda_build', False)])") == "CPU only"
    # this machine's (CPU) builds, through the installed files
    assert environment.cuda_builds() == {"torch": "CPU only", "tensorflow": "CPU only"}
    assert "cuda builds:    torch CPU only  tensorflow CPU only" in environment.describe_environment()
