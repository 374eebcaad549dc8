"""The CUDA library decision of a bundle that carries its own torch (ci/gpu/cuda_libs.py), on
readelf output captured from the real wheels (tests/ci/fixtures/cuda_libs/: ``readelf -W --dyn-syms
-d -V`` of torch 2.14.0's libtorch_cuda.so and of the machine's / torch 2.14.0's NCCL, cuBLAS(Lt),
cuSPARSELt and cuDNN, trimmed to a few real symbols each), and on synthetic libraries."""
from pathlib import Path

import pytest

from conftest import load_tool

cuda_libs = load_tool("ci/gpu/cuda_libs.py")
FIX = Path(__file__).parent / "fixtures" / "cuda_libs"


def elf(name: str):
    return cuda_libs.parse_readelf((FIX / f"{name}.txt").read_text(), name)


def test_parse_readelf_reads_needed_versions_and_strong_references_only():
    torch = elf("libtorch_cuda-2.14.0")
    assert torch.soname == "libtorch_cuda.so"
    assert {"libnccl.so.2", "libcublasLt.so.13", "libcudnn.so.9"} <= set(torch.needed)
    assert ("cublasLtMatmul", "libcublasLt.so.13") in torch.undefined
    assert ("ncclCommResume", None) in torch.undefined  # NCCL exports no symbol versions
    assert not any(n == "pthread_once" for n, _ in torch.undefined)  # a weak reference need not resolve
    assert torch.verneed["libcublasLt.so.13"] == "libcublasLt.so.13"
    lt = elf("libcublasLt.so.13-13.1.0.3")
    assert lt.soname == "libcublasLt.so.13" and lt.defines("cublasLtMatmul", "libcublasLt.so.13")
    assert not lt.defines("cublasLtMatmul", "libcublasLt.so.12") and not lt.defines("pthread_once", None)
    nccl = elf("libnccl.so.2-2.28.9")
    assert nccl.defines("ncclAllReduce", None) and not nccl.defines("ncclCommResume", None)  # weak definitions count


PKGS = {  # package -> (library fixture, machine version, torch 2.14.0's version)
    "nvidia-nccl-cu13": ("libnccl.so.2", "2.28.9", "2.30.7"),
    "nvidia-cusparselt-cu13": ("libcusparseLt.so.0", "0.8.0", "0.8.1"),
    "nvidia-cudnn-cu13": ("libcudnn.so.9", "9.19.0.56", "9.24.0.43"),
}


def _decide_real():
    have = {p: old for p, (_, old, _) in PKGS.items()}
    need = {p: new for p, (_, _, new) in PKGS.items()}
    new_libs = {p: [elf(f"{lib}-{new}")] for p, (lib, _, new) in PKGS.items()}
    old_libs = {p: [elf(f"{lib}-{old}")] for p, (lib, old, _) in PKGS.items()}
    for ver, key in (("13.1.0.3", "have"), ("13.1.1.3", "need")):
        (have if key == "have" else need)["nvidia-cublas"] = ver
        (old_libs if key == "have" else new_libs)["nvidia-cublas"] = [elf(f"libcublas.so.13-{ver}"),
                                                                      elf(f"libcublasLt.so.13-{ver}")]
    need["nvidia-cufft"] = have["nvidia-cufft"] = "12.0.0.61"
    need["nvidia-cufile"] = "1.15.1.6"  # not in the machine's closure
    need["cuda-toolkit"], have["cuda-toolkit"] = "13.0.3.0", "13.0.2"  # metadata only
    return cuda_libs.decide(need, have, new_libs, old_libs, [elf("libtorch_cuda-2.14.0")])


def test_decision_on_torch_2_14_against_the_machines_cuda_13_wheels():
    """The decision for torch 2.14.0 on the real symbols: cuBLAS 13.1.0 and cuSPARSELt 0.8.0 serve
    what libtorch_cuda takes from them; NCCL 2.28.9 lacks ncclCommResume (carried); cuDNN 9.19 is
    refused by torch's own minor-version rule (carried); same version served; absent carried."""
    got = _decide_real()
    assert got["nvidia-cublas"].served and "defines all 2 symbol(s)" in got["nvidia-cublas"].reason
    assert got["nvidia-cusparselt-cu13"].served
    nccl = got["nvidia-nccl-cu13"]
    assert not nccl.served and "libnccl.so.2 2.28.9 lacks 1 symbol(s) libtorch_cuda-2.14.0 takes: ncclCommResume" in nccl.reason
    cudnn = got["nvidia-cudnn-cu13"].reason
    assert not got["nvidia-cudnn-cu13"].served and "runtime cuDNN 9.19 for a build against 9.24" in cudnn
    assert cudnn.endswith("symbols: the machine's 9.19.0.56 defines all 1 symbol(s) the carried binaries take from libcudnn.so.9")
    assert got["nvidia-cudnn-cu13"].rule_only and not nccl.rule_only
    assert got["nvidia-cufft"].served and got["nvidia-cufft"].reason == "same version on the machine"
    assert not got["nvidia-cufile"].served and got["nvidia-cufile"].reason == "not on the machine"
    assert not got["cuda-toolkit"].served


def _lib(soname, defines=(), needs=(), refs=()):
    return cuda_libs.Elf(soname, soname, tuple(needs), frozenset(defines), frozenset(refs), {})


def test_a_carried_library_makes_what_it_needs_carried_too_and_a_missing_soname_is_named():
    """Fixed point: the consumer needs nothing new from libB, but carried libA (refused by its symbols)
    takes ``b_new`` from libB, which the machine's libB lacks -> B is carried too. A soname the
    machine's package does not have is named."""
    consumer = _lib("libtorch.so", needs=("liba.so.1", "libc.so.2"), refs={("a_new", None), ("c_old", None)})
    new = {"A": [_lib("liba.so.1", {"a_old", "a_new"}, ("libb.so.1",), {("b_new", None)})],
           "B": [_lib("libb.so.1", {"b_old", "b_new"})], "C": [_lib("libc.so.2", {"c_old"})]}
    old = {"A": [_lib("liba.so.1", {"a_old"})], "B": [_lib("libb.so.1", {"b_old"})], "C": [_lib("libc.so.1", {"c_old"})]}
    got = cuda_libs.decide({"A": "2", "B": "2", "C": "2"}, {"A": "1", "B": "1", "C": "1"}, new, old, [consumer])
    assert not got["A"].served and "lacks 1 symbol(s) libtorch.so takes: a_new" in got["A"].reason
    assert not got["B"].served and "libb.so.1 1 lacks 1 symbol(s) liba.so.1 takes: b_new" in got["B"].reason
    assert not got["C"].served and "libc.so.2 (needed by libtorch.so) is not in the machine's C 1" in got["C"].reason
    consumer = _lib("libtorch.so", needs=("liba.so.1",), refs={("a_old", None)})
    got = cuda_libs.decide({"A": "2", "B": "2"}, {"A": "1", "B": "1"}, new, old, [consumer])
    assert got["A"].served and got["B"].served  # nothing carried needs b_new


def test_a_packages_own_libraries_are_not_held_against_it():
    """cuDNN's sub-libraries take new symbols from its libcudnn_graph: they come (or stay) together, so
    only what other binaries take decides; with torch's rule refusing it, it is carried as rule-only."""
    consumer = _lib("libtorch_cuda.so", needs=("libcudnn.so.9",), refs={("cudnnGetVersion", None)})
    new = {"nvidia-cudnn-cu13": [_lib("libcudnn.so.9", {"cudnnGetVersion"}),
                                 _lib("libcudnn_graph.so.9", {"g_old", "g_new"}),
                                 _lib("libcudnn_cnn.so.9", needs=("libcudnn_graph.so.9",), refs={("g_new", None)})]}
    old = {"nvidia-cudnn-cu13": [_lib("libcudnn.so.9", {"cudnnGetVersion"}), _lib("libcudnn_graph.so.9", {"g_old"})]}
    got = cuda_libs.decide({"nvidia-cudnn-cu13": "9.24.0.43"}, {"nvidia-cudnn-cu13": "9.19.0.56"}, new, old, [consumer])
    d = got["nvidia-cudnn-cu13"]
    assert not d.served and d.rule_only and "defines all 1 symbol(s)" in d.reason
    got = cuda_libs.decide({"nvidia-cudnn-cu13": "9.19.1.0"}, {"nvidia-cudnn-cu13": "9.19.0.56"}, new, old, [consumer])
    assert got["nvidia-cudnn-cu13"].served  # the rule holds: the machine's serves


@pytest.mark.parametrize("need,have,ok", [("9.24.0.43", "9.19.0.56", False), ("9.19.0.56", "9.24.0.43", True),
                                          ("9.24.0.43", "8.9.7.29", False), ("9.24.0.43", "9.24.1.1", True)])
def test_cudnn_rule_is_torchs_own(need, have, ok):
    """torch.backends.cudnn: same major, runtime minor >= the build's minor."""
    assert (cuda_libs.RUNTIME_RULES["nvidia-cudnn-cu13"](need, have) is None) is ok
