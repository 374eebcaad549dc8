"""`verify` and the GPU cells judge a run whose engine process reports a failed plugin patch
group (a fix its probe calls needed, whose target this vLLM lacks) as FAIL, even when its tokens
audit clean: the fix did not land, so a clean audit is luck, not the plugin's doing."""
from vllm_platform_ext.testing import cells
from vllm_platform_ext.verify import runner
from vllm_platform_ext.testing.engine import EngineRun, failed_patches


class _Audit:
    bad_fraction, positions = 0.0, 100


def _run(**patches):  # the CPU GDN route ran (its counters: testing.ranks.route_state)
    return EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4, patches=patches,
                     routes=[{"rank": 0, "routes": {"gdn.cpu_spec_decode": {"calls": 5}}}])


def test_failed_patches_lists_only_failures():
    run = _run(**{"gdn.cpu_spec_decode": "failed", "turboquant_spec_verify": "skipped", "x": "applied"})
    assert failed_patches(run) == ["gdn.cpu_spec_decode"]
    assert failed_patches(EngineRun(mode="base", k=0)) == []


def test_verify_row_fails_on_a_failed_patch_group():
    ok, note = runner.judge(_run(**{"gdn.cpu_spec_decode": "applied"}), _Audit(), floor=0.0, margin=0.02)
    assert ok and note == ""
    ok, note = runner.judge(_run(**{"gdn.cpu_spec_decode": "failed"}), _Audit(), floor=0.0, margin=0.02)
    assert not ok and "gdn.cpu_spec_decode" in note


def test_gpu_cell_fails_on_a_failed_patch_group_plugin_on_only():
    run = _run(**{"turboquant_spec_verify": "failed"})
    status, note = cells.judge(cells.Cell(mode="mtp", k=2, plugin=True), run, _Audit(), floor=0.0, margin=0.02)
    assert status == "fail" and "turboquant_spec_verify" in note
    # plugin-off cells disable the groups; their status is upstream's, judged by the audit
    status, _ = cells.judge(cells.Cell(mode="mtp", k=2, plugin=False), run, _Audit(), floor=0.0, margin=0.02)
    assert status == "upstream-works"


def test_verify_row_fails_when_no_draft_is_accepted():
    """Right tokens from a speculative engine that never accepted a draft prove nothing of the
    acceptance path (issue 49): FAIL, naming it; plain decoding needs no drafts."""
    run = EngineRun(mode="mtp", k=3, num_draft_tokens=300, num_accepted_tokens=0, patches={})
    ok, note = runner.judge(run, _Audit(), floor=0.0, margin=0.02)
    assert not ok and "no draft accepted of 300" in note
    ok, _ = runner.judge(EngineRun(mode="base", k=0, patches={}), _Audit(), floor=0.0, margin=0.02)
    assert ok


def _routes(calls):
    return [{"rank": r, "routes": {"gdn.cpu_spec_decode": {"calls": c, "native": 0, "delegated": 0}}}
            for r, c in enumerate(calls)]


def test_verify_row_fails_when_the_applied_route_never_ran():
    """A group reported applied is patched, not called: a speculative row needs routed calls on every
    rank; a route-off control (the group skipped/disabled) needs none."""
    run = EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"gdn.cpu_spec_decode": "applied"}, routes=_routes([5]))
    assert runner.judge(run, _Audit(), floor=0.0, margin=0.02) == (True, "")
    run.routes = _routes([5, 0])  # TP=2: rank 1 never took the route
    ok, note = runner.judge(run, _Audit(), floor=0.0, margin=0.02)
    assert not ok and "routed no call" in note and "[5, 0]" in note
    run.routes, run.routes_error = [], "RuntimeError: no collective_rpc"
    ok, note = runner.judge(run, _Audit(), floor=0.0, margin=0.02)
    assert not ok and "no collective_rpc" in note
    off = EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"gdn.cpu_spec_decode": "skipped"}, routes=_routes([3]))
    ok, note = runner.judge(off, _Audit(), floor=0.0, margin=0.02)
    assert not ok and "skipped but routed [3] calls" in note
    off.routes = _routes([0])
    assert runner.judge(off, _Audit(), floor=0.0, margin=0.02)[0]


def _tq_routes(k1):
    return [{"rank": 0, "routes": {"turboquant_spec_verify": {"k1": k1, "rows": 0, "decode": 0}}}]


def test_gpu_cell_needs_the_turboquant_route_to_have_run():
    """A plugin cell on a TurboQuant KV cache passes only when the verify route routed calls; a
    route-off control (the group disabled) that routed any is the harness's error; bf16 KV needs none."""
    tq = cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=True)
    run = EngineRun(mode="mtp", k=3, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"turboquant_spec_verify": "applied"}, routes=_tq_routes(7))
    assert cells.judge(tq, run, _Audit(), 0.0, 0.02) == ("pass", "")
    run.routes = _tq_routes(0)
    status, note = cells.judge(tq, run, _Audit(), 0.0, 0.02)
    assert status == "fail" and "routed no call" in note
    bf16 = cells.Cell(mode="mtp", k=3, kv="auto", plugin=True)
    assert cells.judge(bf16, run, _Audit(), 0.0, 0.02) == ("pass", "")
    off = cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=True, disable="turboquant_spec_verify")
    ctl = EngineRun(mode="mtp", k=3, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"turboquant_spec_verify": "skipped"}, routes=_tq_routes(2))
    status, note = cells.judge(off, ctl, _Audit(), 0.0, 0.02)
    assert status == "fail" and "skipped but routed [2] calls" in note
    status, _ = cells.judge(cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=False), ctl, _Audit(), 0.0, 0.02)
    assert status == "harness-error"


def test_gpu_cell_reads_every_tp_workers_patch_report():
    """TP > 1: a group that failed on one worker fails the cell, though the driver's report is clean."""
    run = _run(**{"turboquant_spec_verify": "applied"})
    run.ranks = [{"rank": 0, "patches": {"turboquant_spec_verify": "applied"}},
                 {"rank": 1, "patches": {"turboquant_spec_verify": "failed"}}]
    status, note = cells.judge(cells.Cell(mode="mtp", k=2, plugin=True, tp=2), run, _Audit(), 0.0, 0.02)
    assert status == "fail" and "turboquant_spec_verify" in note
