"""`verify` and the GPU cells judge a run whose engine process reports a failed plugin patch
group (a fix its probe calls needed, whose target this vLLM lacks) as FAIL, even when its tokens
audit clean: the fix did not land, so a clean audit is luck, not the plugin's doing."""
from vllm_platform_ext.testing import cells
from vllm_platform_ext.testing.audit import AuditResult
from vllm_platform_ext.testing.bounds import judged
from vllm_platform_ext.verify import runner
from vllm_platform_ext.testing.engine import EngineRun, failed_patches

# the tokens' verdict of a clean audit (0 of 100 bad against a floor of 0, at both thresholds)
OK = judged(AuditResult([[0.0] * 100]), AuditResult([[0.0] * 100]))[0]


def _run(**patches):  # the CPU GDN route ran (its counters: testing.ranks.route_state)
    return EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4, patches=patches,
                     routes=[{"rank": 0, "routes": {"gdn.cpu_spec_decode": {"calls": 5}}}])


def test_failed_patches_lists_only_failures():
    run = _run(**{"gdn.cpu_spec_decode": "failed", "turboquant_spec_verify": "skipped", "x": "applied"})
    assert failed_patches(run) == ["gdn.cpu_spec_decode"]
    assert failed_patches(EngineRun(mode="base", k=0)) == []


def test_verify_row_fails_on_a_failed_patch_group():
    ok, note = runner.judge(_run(**{"gdn.cpu_spec_decode": "applied"}), OK)
    assert ok and note == ""
    ok, note = runner.judge(_run(**{"gdn.cpu_spec_decode": "failed"}), OK)
    assert not ok and "gdn.cpu_spec_decode" in note


def test_gpu_cell_fails_on_a_failed_patch_group_plugin_on_only():
    run = _run(**{"turboquant_spec_verify": "failed"})
    status, note = cells.judge(cells.Cell(mode="mtp", k=2, plugin=True), run, OK)
    assert status == "fail" and "turboquant_spec_verify" in note
    # plugin-off cells disable the groups; their status is upstream's, judged by the audit
    status, _ = cells.judge(cells.Cell(mode="mtp", k=2, plugin=False), run, OK)
    assert status == "upstream-works"


def test_verify_row_fails_when_no_draft_is_accepted():
    """Right tokens from a speculative engine that never accepted a draft prove nothing of the
    acceptance path (issue 49): FAIL, naming it; plain decoding needs no drafts."""
    run = EngineRun(mode="mtp", k=3, num_draft_tokens=300, num_accepted_tokens=0, patches={})
    ok, note = runner.judge(run, OK)
    assert not ok and "no draft accepted of 300" in note
    ok, _ = runner.judge(EngineRun(mode="base", k=0, patches={}), OK)
    assert ok


def _routes(calls):
    return [{"rank": r, "routes": {"gdn.cpu_spec_decode": {"calls": c, "native": 0, "delegated": 0}}}
            for r, c in enumerate(calls)]


def test_verify_row_fails_when_the_applied_route_never_ran():
    """A group reported applied is patched, not called: a speculative row needs routed calls on every
    rank; a route-off control (the group skipped/disabled) needs none."""
    cpu = {"cpu_path": "no-avx512bf16"}
    run = EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"gdn.cpu_spec_decode": "applied"}, routes=_routes([5]), engine_path=cpu)
    assert runner.judge(run, OK) == (True, "")
    # on a GPU engine the CPU route has nothing to route (0.26 applies the group there: its target imports)
    gpu = EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4, routes=_routes([0]),
                    patches={"gdn.cpu_spec_decode": "applied"}, engine_path={"platform": "NvmlCudaPlatform"})
    assert runner.judge(gpu, OK) == (True, "")
    run.routes = _routes([5, 0])  # TP=2: rank 1 never took the route
    ok, note = runner.judge(run, OK)
    assert not ok and "routed no call" in note and "[5, 0]" in note
    run.routes, run.routes_error = [], "RuntimeError: no collective_rpc"
    ok, note = runner.judge(run, OK)
    assert not ok and "no collective_rpc" in note
    off = EngineRun(mode="mtp", k=2, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"gdn.cpu_spec_decode": "skipped"}, routes=_routes([3]), engine_path=cpu)
    ok, note = runner.judge(off, OK)
    assert not ok and "skipped but routed [3] calls" in note
    off.routes = _routes([0])
    assert runner.judge(off, OK)[0]


def _tq_routes(k1):
    return [{"rank": 0, "routes": {"turboquant_spec_verify": {"k1": k1, "rows": 0, "decode": 0}}}]


def test_gpu_cell_needs_the_turboquant_route_to_have_run():
    """A plugin cell on a TurboQuant KV cache passes only when the verify route routed calls; a
    route-off control (the group disabled) that routed any is the harness's error; bf16 KV needs none."""
    tq = cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=True)
    run = EngineRun(mode="mtp", k=3, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"turboquant_spec_verify": "applied"}, routes=_tq_routes(7))
    assert cells.judge(tq, run, OK) == ("pass", "")
    run.routes = _tq_routes(0)
    status, note = cells.judge(tq, run, OK)
    assert status == "fail" and "routed no call" in note
    bf16 = cells.Cell(mode="mtp", k=3, kv="auto", plugin=True)
    assert cells.judge(bf16, run, OK) == ("pass", "")
    off = cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=True, disable="turboquant_spec_verify")
    ctl = EngineRun(mode="mtp", k=3, num_draft_tokens=10, num_accepted_tokens=4,
                    patches={"turboquant_spec_verify": "skipped"}, routes=_tq_routes(2))
    status, note = cells.judge(off, ctl, OK)
    assert status == "fail" and "skipped but routed [2] calls" in note
    status, _ = cells.judge(cells.Cell(mode="mtp", k=3, kv="turboquant_k8v4", plugin=False), ctl, OK)
    assert status == "harness-error"


def test_gpu_cell_reads_every_tp_workers_patch_report():
    """TP > 1: a group that failed on one worker fails the cell, though the driver's report is clean."""
    run = _run(**{"turboquant_spec_verify": "applied"})
    run.ranks = [{"rank": 0, "patches": {"turboquant_spec_verify": "applied"}},
                 {"rank": 1, "patches": {"turboquant_spec_verify": "failed"}}]
    status, note = cells.judge(cells.Cell(mode="mtp", k=2, plugin=True, tp=2), run, OK)
    assert status == "fail" and "turboquant_spec_verify" in note


def _rows(monkeypatch, kind: str, regrets: dict, tokens: dict | None = None, floor=None):
    """audit_kind with the engine and the reference stubbed: ``regrets[mode]`` is each row's audit
    (one list per prompt), ``tokens[mode]`` its ids (default: the same for every row)."""
    from vllm_platform_ext.testing.engine import EngineSettings
    from vllm_platform_ext.testing.engine import EngineSettings
    from vllm_platform_ext.testing.prompts import default_prompts

    configs = runner.parse_modes("base,mtp:2,ngram:2")
    P = len(default_prompts())
    same = [[7] * 128 for _ in range(P)]

    def engine(model, prompts, cfgs, settings, env=None, log_path=None):
        return [EngineRun(mode=c.mode, k=c.k, tokens=(tokens or {}).get(c.mode, same), num_drafts=5,
                          num_draft_tokens=0 if c.mode == "base" else 10, num_accepted_tokens=0 if c.mode == "base"
                          else 4, patches={}) for c in cfgs]

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        modes = [c.mode for c in configs]
        return AuditResult(floor or [[0.0] * 128] * P), {k: AuditResult(regrets[modes[int(k)]]) for k in generated}

    monkeypatch.setattr(runner, "run_in_subprocess", engine)
    monkeypatch.setattr(runner, "reference_audits", reference)
    rows = runner.audit_kind(kind, "/kit", configs, EngineSettings(max_tokens=128), 0.01, None, log=lambda *_: None)
    return {r.mode: r for r in rows}


def _prompts_with(bad: int, value: float = 1.0, P: int = 7, n: int = 128):
    """P prompts of n positions, the first ``bad`` of them (in order) at regret ``value``."""
    flat = [value] * bad + [0.0] * (P * n - bad)
    return [flat[i * n:(i + 1) * n] for i in range(P)]


def test_verify_rows_are_judged_in_positions_against_one_floor(monkeypatch):
    """896 positions: plain decoding at 4 bad (limit 4 against the bf16 floor 0) passes; a speculative
    row at 9 passes against max(bf16 0, plain 4) = 4 (limit 11), one at 36 (9/224's rate) fails; the
    table names counts, floors and limits."""
    rows = _rows(monkeypatch, "qwen3_next", {"base": _prompts_with(4), "mtp": _prompts_with(9),
                                            "ngram": _prompts_with(36)})
    assert rows["base"].passed and rows["mtp"].passed and not rows["ngram"].passed
    assert rows["ngram"].note == ("36 of 896 positions > 0.5 nats, limit 11 (bf16 floor 0, plain decoding 4); "
                                  "36 of 896 positions > 0.1 nats, limit 11 (bf16 floor 0, plain decoding 4)")
    assert rows["mtp"].criteria[0]["floor_plain"] == 4 and rows["base"].criteria[0]["floor_plain"] is None
    assert rows["mtp"].positions == 896 and rows["mtp"].floor == 4 / 896
    table = runner.format_table(list(rows.values()))
    assert "4/0/4" in table and "9/4/11" in table and "36/4/11" in table and "of the 896 generated positions" in table


def test_verify_plain_row_that_is_wrong_does_not_raise_the_floor(monkeypatch):
    """A plain row at 30 bad fails (limit 4) and lifts its speculative rows' floor only to its own
    limit, 4: a speculative row at 30 fails too (the old rule: floor 30/896 + 0.02 let 47 through)."""
    rows = _rows(monkeypatch, "qwen3_next", {"base": _prompts_with(30), "mtp": _prompts_with(30),
                                            "ngram": _prompts_with(0)})
    assert not rows["base"].passed and not rows["mtp"].passed and rows["ngram"].passed
    assert "capped from 30" in rows["mtp"].note and rows["mtp"].criteria[0]["limit"] == 11


def test_verify_strict_threshold_fails_alone(monkeypatch):
    """0.1 nats: a speculative row with no position past 0.5 nats but 60 near-ties the wrong way
    (regret 0.2) against a floor of 10 such fails; the floor's own count passes."""
    floor = _prompts_with(10, 0.2)
    rows = _rows(monkeypatch, "qwen3_next", {"base": floor, "mtp": _prompts_with(60, 0.2), "ngram": floor},
                 floor=floor)
    assert rows["base"].passed and rows["ngram"].passed and not rows["mtp"].passed
    assert rows["mtp"].note.startswith("60 of 896 positions > 0.1 nats, limit ")
    assert [c["count"] for c in rows["mtp"].criteria] == [0, 60]


def test_verify_split_rule_where_it_applies(monkeypatch):
    """A speculative row whose tokens part from the plain row's at a position where float32 prefers
    plain's token by 1.2 nats fails on a bf16-KV kit model (one bad position: under its count limit),
    and is not judged so on the MoE kind (expert routing flips under other batch shapes)."""
    P = 7
    plain = [[7] * 128 for _ in range(P)]
    spec = [list(t) for t in plain]
    spec[2][5] = 9
    spec_r = _prompts_with(0)
    spec_r[2][5] = 1.2
    regrets = {"base": _prompts_with(0), "mtp": spec_r, "ngram": _prompts_with(0)}
    rows = _rows(monkeypatch, "qwen3_next", regrets, {"mtp": spec})
    assert not rows["mtp"].passed and rows["ngram"].passed
    assert rows["mtp"].note == ("tokens part from plain decoding with the speculative token worse by > 0.5 nats in "
                                "float32 at 1 prompt(s): prompt 3 at 5 (1.20 vs 0.00)")
    assert _rows(monkeypatch, "qwen3_5_moe", regrets, {"mtp": spec})["mtp"].passed
    spec_r[2][5] = 0.3  # a near-tie split: not a wrong token
    assert _rows(monkeypatch, "qwen3_next", regrets, {"mtp": spec})["mtp"].passed


def test_verify_drift_fails_alone_and_has_its_column(monkeypatch):
    """An engine whose tokens are the reference's own but whose log-probabilities drift (a state wrong by
    one token's update, tokens unchanged) fails on drift alone; the table shows drift's counts."""
    from vllm_platform_ext.testing.audit import AuditResult

    from vllm_platform_ext.testing.engine import EngineSettings
    from vllm_platform_ext.testing.prompts import default_prompts

    P, n = len(default_prompts()), 128
    configs = runner.parse_modes("base,mtp:2")

    def engine(model, prompts, cfgs, settings, env=None, log_path=None):
        return [EngineRun(mode=c.mode, k=c.k, tokens=[[7] * n] * P, num_drafts=5, logprobs=[[[[7, 0.0]]] * n] * P,
                          num_draft_tokens=0 if c.mode == "base" else 10,
                          num_accepted_tokens=0 if c.mode == "base" else 4) for c in cfgs]

    def reference(path, prompts, generated, max_tokens, python=None, logprobs=None):
        assert set(logprobs) == set(generated)  # every run's logprobs went to the reference
        drift = {"0": 0, "1": 40}
        out = {k: AuditResult([[0.0] * n] * P, drift=[[0.5] * drift[k] + [0.0] * (n - drift[k])] + [[0.0] * n] * (P - 1))
               for k in generated}
        return AuditResult([[0.0] * n] * P, drift=[[0.0] * n] * P), out

    monkeypatch.setattr(runner, "run_in_subprocess", engine)
    monkeypatch.setattr(runner, "reference_audits", reference)
    rows = {r.mode: r for r in runner.audit_kind("qwen3_next", "/kit", configs, EngineSettings(max_tokens=n), 0.01,
                                                 None, log=lambda *_: None)}
    assert rows["base"].passed and not rows["mtp"].passed
    assert rows["mtp"].note == "40 of 896 positions drift > 0.2 nats, limit 4 (bf16 floor 0, plain decoding 0)"
    table = runner.format_table(list(rows.values()))
    assert "drift>0.2" in table and "40/0/4" in table
