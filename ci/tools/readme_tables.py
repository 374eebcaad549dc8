"""README / docs figures and the GPU results tables, from committed result files.

Every result the README and docs/ state must come from a committed file under ``results/`` with a
run header (date, device, versions, commit, command). This tool

* ``record -o FILE -- CMD ...``: runs ``CMD`` here and writes its output under a run header
  (how the CPU ``verify``/``doctor`` samples in the README were made: ``results/cpu/``);
* ``gpu-add RESULTS_MD --command CMD [--commit C]``: files a GPU engine matrix ``results.md``
  (``testing/cells.py``'s output, brought back from the GPU machine) as
  ``results/gpu/<date>-vllm-<line>-engine-matrix/<date>-vllm-<line>.md`` with a run header;
* ``write`` / ``check``: (re)generates docs/results.md's GPU results table (between the
  ``gpu-results`` markers) from ``results/gpu/**/*.md``, zero or more files, and the `full` matrices'
  summary (between the ``full-matrix`` markers) from ``results/gpu/**/*-full-shardNN.json``; ``check``
  exits 1 when docs/results.md is out of date.

``figures()`` / ``unbacked()`` are what tests/ci/test_readme_figures.py uses: the numeric claims of
the README and docs/ (numbers with a unit, ratios, decimals) that no committed result file contains.
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import pathlib
import platform
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# where the generated tables live (links in them are relative to docs/)
RESULTS_DOC = ROOT / "docs" / "results.md"
GPU_RESULTS = ROOT / "results" / "gpu"
# where committed measurements live; every README / docs figure must appear in one of these files
RESULT_GLOBS = ("results/gpu/**/*.md", "results/cpu/**/*.md", "results/bench/**/*.md", "results/bench/**/*.json")
# under results/ but not measurements: the layout note and the GPU run diary (it retells results, it backs nothing)
NOT_RESULTS = ("results/README.md", "results/gpu/DIARY.md")
BEGIN, END = "<!-- gpu-results:begin (ci/tools/readme_tables.py write) -->", "<!-- gpu-results:end -->"
HEADER_KEYS = ("date", "device", "commit", "command")


# ---- run headers ------------------------------------------------------------------------------

def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() or "unknown"


def _versions() -> dict:
    try:
        sys.path.insert(0, str(ROOT))
        from vllm_platform_ext.detect import installed_versions

        return {k: v for k, v in installed_versions().items() if v is not None}
    except Exception as exc:  # the header still says why versions are missing
        return {"versions": f"unavailable ({type(exc).__name__}: {exc})"}


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    except ImportError:
        pass
    cpu = platform.processor() or "cpu"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {cpu}"


def header(command: str, commit: str | None = None, date: str | None = None, device: str | None = None,
           versions: dict | None = None) -> str:
    date = date or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"- date: {date}", f"- device: {device or _device()}"]
    lines += [f"- {k}: {v}" for k, v in (versions if versions is not None else _versions()).items()]
    lines += [f"- commit: {commit or _commit()}", f"- command: `{command}`"]
    return "\n".join(lines)


def parse_header(text: str) -> dict:
    """``- key: value`` lines at the top of a result file (the command without backticks)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^- ([\w.-]+): (.*)$", line)
        if m:
            out.setdefault(m.group(1), m.group(2).strip().strip("`"))
        elif out and line.strip() and not line.startswith("#"):
            break
    return out


def missing_header_keys(text: str) -> list[str]:
    head = parse_header(text)
    missing = [k for k in HEADER_KEYS if not head.get(k)]
    if not any(k in head for k in ("vllm", "torch")):
        missing.append("versions")
    return missing


# ---- the GPU results table --------------------------------------------------------------------

_LINE = re.compile(r"\b(\d+\.\d+)\.\d+")


def gpu_summary(path: pathlib.Path) -> dict:
    """One results file: its header and the count of cell statuses, plugin on and off."""
    text = path.read_text()
    head = parse_header(text)
    on: dict[str, int] = {}
    off: dict[str, int] = {}
    for line in text.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) < 11 or cols[0] in ("model",) or set(cols[0]) <= {"-"}:
            continue
        for col, bucket in ((cols[5], on), (cols[10], off)):
            status = col.split(" ")[0].split(":")[0]
            if status and status != "—":
                bucket[status] = bucket.get(status, 0) + 1
    vllm = head.get("vllm", "?")
    m = _LINE.search(vllm)
    return {"file": path.relative_to(ROOT).as_posix(), "date": head.get("date", "?").split(" ")[0],
            "device": head.get("device", "?"), "vllm": vllm, "line": m.group(1) if m else "?", "on": on, "off": off}


def _counts(d: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(d.items())) or "—"


# the lent machine a GPU sat in ("card 1 of an `nvidia-h200-x4` machine (64 CPUs), CPUs 16-31"): the result
# file's header keeps it; the table names the GPU only
_MACHINE = re.compile(r"\s*\((?:cards? [\d and]+) of an `?nvidia-h200[\w-]*`? machine[^)]*\)"
                      r"|,? (?:card \d+ )?of an `?nvidia-h200[\w-]*`? machine \(\d+ CPUs\), CPUs (?:all \d+|\d+-\d+)")


def gpu_device(device: str) -> str:
    return _MACHINE.sub("", device)


def gpu_table(results_dir: pathlib.Path = GPU_RESULTS) -> str:
    files = sorted(results_dir.rglob("*.md"), key=lambda p: p.name) if results_dir.is_dir() else []
    # engine matrices only (testing/cells.py's "Measured ... on ..." table); other records there (window times) are not rows
    files = [f for f in files if f.name not in ("README.md", "DIARY.md") and "\n| model | spec |" in f.read_text()]
    if not files:
        return ("No GPU engine matrix result is committed yet (`results/gpu/` has none): nothing on "
                "NVIDIA is claimed here beyond the kernel and wiring tests above.")
    lines = ["| vLLM | device | date | cells with the plugin | upstream, plugin off | result file |",
             "|---|---|---|---|---|---|"]
    for s in map(gpu_summary, files):
        lines.append(f"| {s['vllm']} | {gpu_device(s['device'])} | {s['date']} | {_counts(s['on'])} | {_counts(s['off'])} | "
                     f"[{pathlib.PurePath(s['file']).name}](../{s['file']}) |")
    return "\n".join(lines)


MATRIX_BEGIN, MATRIX_END = "<!-- full-matrix:begin (ci/tools/readme_tables.py write) -->", "<!-- full-matrix:end -->"
_SHARD = re.compile(r"-(\d+\.\d+\.\d+)-full-shard\d+\.json$")
_SPEC = {("base", 0): "none", ("mtp", 1): "MTP k=1", ("mtp", 3): "MTP k=3", ("ngram", 3): "ngram k=3"}
_UPSTREAM = (("upstream-crash", "crash"), ("upstream-wrong", "wrong"), ("upstream-works", "right"))


def full_matrix(results_dir: pathlib.Path = GPU_RESULTS) -> dict:
    """The `full` suite's cells as the GPU wrote them (``*-<vLLM>-full-shardNN.json``), by vLLM line and
    row (graphs, speculation, bf16 or TurboQuant KV): the statuses, plugin on and off."""
    import json

    out: dict = {}
    for f in sorted(results_dir.rglob("*-full-shard*.json"), key=lambda p: p.name):
        line = _SHARD.search(f.name)
        for r in json.loads(f.read_text()) if line else []:
            c = r["cell"]
            row = (c["graphs"], _SPEC.get((c["mode"], c["k"]), f"{c['mode']} k={c['k']}"),
                   "bf16" if c["kv"] == "auto" else "TurboQuant")
            side = out.setdefault(line.group(1), {}).setdefault(row, {"on": [], "off": []})
            side["on" if c["plugin"] else "off"].append(r["status"])
    return out


def full_matrix_table(results_dir: pathlib.Path = GPU_RESULTS) -> str:
    m = full_matrix(results_dir)
    if not m:
        return "No `full` matrix is committed yet (`results/gpu/**/*-full-shardNN.json`)."
    lines = sorted(m)
    specs = list(_SPEC.values())
    rows = sorted({r for v in m.values() for r in v}, key=lambda r: (
        r[0] != "full_and_piecewise", specs.index(r[1]) if r[1] in specs else len(specs), r[2] != "bf16"))
    out = ["| graphs | speculation | KV | " + " | ".join(f"{v} with the plugin | {v} upstream alone" for v in lines) + " |",
           "|---|---|---|" + "---|---|" * len(lines)]
    for row in rows:
        cols = []
        for v in lines:
            got = m[v].get(row, {"on": [], "off": []})
            on, off = got["on"], collections.Counter(got["off"])
            bad = len(on) - on.count("pass")
            cols.append(("—" if not on else f"{on.count('pass')} pass" + (f", {bad} not" if bad else "")))
            cols.append(", ".join(f"{off[k]} {w}" for k, w in _UPSTREAM if off[k]) or "—")
        graphs = "FULL_AND_PIECEWISE" if row[0] == "full_and_piecewise" else row[0]
        out.append(f"| {graphs} | {row[1]} | {row[2]} | " + " | ".join(cols) + " |")
    return "\n".join(out)


def render(readme: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in readme or end not in readme:
        raise ValueError(f"docs/results.md has no generated block: add the lines {begin!r} and {end!r}")
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def render_all(readme: str) -> str:
    """docs/results.md with both generated blocks (results files, the `full` matrices) made again."""
    return render(render(readme, gpu_table()), full_matrix_table(), MATRIX_BEGIN, MATRIX_END)


# ---- README figures ---------------------------------------------------------------------------

_UNIT = r"(?:%|x|×|s|ms|µs|us|min|minutes|seconds|GiB|GB|MiB|MB|KB|nats|tokens/s|tok/s|points)"
FIGURE = re.compile(
    r"(?<![\w./=])(\d+(?:\.\d+)?\s?(?:–|-)\s?\d+(?:\.\d+)?\s?" + _UNIT + r"(?![\w/])"  # ranges with a unit
    r"|\d+/\d+(?![\w/.])"  # ratios: 19/347
    r"|\d+(?:\.\d+)?\s?" + _UNIT + r"(?![\w/])"  # a number with a unit
    r"|\d+\.\d{2,}(?![\w.])"  # measured decimals: 0.004
    r"|\d+ (?:applied|skipped|failed|of \d+)\b)"  # counts of a report
)
# not claims of a measurement: versions, line numbers, the plugin's documented settings
IGNORE = re.compile(r"^(?:0\.\d\d?|\d+\.\d+\.\d+)$")
REQUIREMENT = re.compile(r"(?:≥|>=|<=|Python|torch|Triton|vLLM|vllm|transformers|sm_)\s*$")  # "Python ≥ 3.10"
# a line of a fenced block that is a command to type, not a sample of output
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:python3?|bash|pip|vllm|vllm-platform-ext|cd|export|git)\b")
RANGE = re.compile(r"^(\d+(?:\.\d+)?)\s?(?:–|-)\s?(\d+(?:\.\d+)?)\s?" + _UNIT + r"$")


def figures(text: str) -> list[str]:
    """The numeric claims of ``text``, outside links' targets and code spans of options."""
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    out = []
    for m in FIGURE.finditer(text):
        f = m.group(0).strip()
        before = text[max(0, m.start() - 16):m.start()]
        if not IGNORE.match(f) and not REQUIREMENT.search(before):
            out.append(f)
    return list(dict.fromkeys(out))


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.replace("–", "-")).strip()


def result_texts(root: pathlib.Path = ROOT) -> dict[str, str]:
    out = {}
    for pattern in RESULT_GLOBS:
        for p in sorted(root.glob(pattern)):
            if p.relative_to(root).as_posix() not in NOT_RESULTS:
                out[p.relative_to(root).as_posix()] = p.read_text(errors="replace")
    return out


def _split(readme: str) -> tuple[str, list[str]]:
    """(prose, the lines of fenced code blocks) of a Markdown text."""
    prose, code, inside = [], [], False
    for line in readme.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return "\n".join(prose), code


def unbacked(readme: str, texts: dict[str, str], allowed: frozenset = frozenset()) -> list[str]:
    """The README's claims that no committed result file backs.

    * A line of a fenced code block (a sample of ``doctor``/``verify`` output) that holds a
      figure must appear in one result file as it stands (whitespace normalised; a line cut
      short with ``...`` matches by its beginning).
    * A figure in the prose must appear in a result file (dashes and whitespace normalised; a
      number with a unit also matches the bare number; a range such as ``208-260 s`` matches when
      both of its ends do). Lines of a fenced block that are commands to type are not samples."""
    corpus = _norm("\n".join(texts.values()))
    prose, code = _split(readme)
    missing = []
    for line in code:
        if not figures(line) or COMMAND.match(line):
            continue
        n = _norm(line)
        if n.endswith("..."):
            n = n[:-3].rstrip()
        if n not in corpus:
            missing.append(line.strip())
    for f in figures(prose):
        if f in allowed:
            continue
        n = _norm(f)
        bare = re.sub(r"\s?" + _UNIT + r"$", "", n)
        if n in corpus or n.replace(" ", "") in corpus.replace(" ", ""):
            continue
        if bare != n and re.search(r"(?<![\d.])" + re.escape(bare) + r"(?![\d])", corpus):
            continue
        ends = RANGE.match(n)  # a range summarises measurements: both of its ends must be measured
        if ends and all(re.search(r"(?<![\d.])" + re.escape(e) + r"(?![\d])", corpus) for e in ends.groups()):
            continue
        missing.append(f)
    return missing


# ---- CLI ----------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run a command, write its output under a run header")
    r.add_argument("-o", "--out", required=True)
    r.add_argument("--title", default="")
    r.add_argument("argv", nargs=argparse.REMAINDER)
    g = sub.add_parser("gpu-add", help="file a GPU results.md as results/gpu/<date>-vllm-<line>-engine-matrix/<date>-vllm-<line>.md")
    g.add_argument("results_md")
    g.add_argument("--command", required=True, help="the command that produced it on the GPU machine")
    g.add_argument("--commit", default=None, help="the commit that ran there (default: HEAD)")
    sub.add_parser("write", help="regenerate docs/results.md's GPU results tables")
    sub.add_parser("check", help="exit 1 when docs/results.md's GPU results tables are out of date")
    a = ap.parse_args(argv)
    if a.cmd == "record":
        cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        out = pathlib.Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        body = proc.stdout if proc.stdout.strip() else proc.stderr[-4000:]
        out.write_text(f"# {a.title or shlex.join(cmd)}\n\n{header(shlex.join(cmd))}\n- exit status: "
                       f"{proc.returncode}\n\n```\n{body.rstrip()}\n```\n")
        print(out)
        return proc.returncode
    if a.cmd == "gpu-add":
        text = pathlib.Path(a.results_md).read_text()
        m = re.search(r"Measured (\S+ [\d:]+ UTC) on ([^;]+); (.*)\.\s*$", text, re.M)
        if not m:
            print(f"{a.results_md}: no 'Measured <date> on <device>; <versions>.' line (testing/cells.py output)",
                  file=sys.stderr)
            return 2
        date, device, vers = m.groups()
        versions = dict(v.strip().split(" ", 1) for v in vers.split(", ") if " " in v.strip())
        line = _LINE.search(versions.get("vllm", ""))
        name = f"{date.split(' ')[0]}-vllm-{line.group(1) if line else 'unknown'}.md"
        dest = GPU_RESULTS / f"{name[:-3]}-engine-matrix" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f"# GPU engine matrix, vLLM {versions.get('vllm', '?')}\n\n"
                        + header(a.command, a.commit, date, device, versions) + "\n\n" + text)
        print(dest)
        return 0
    new = render_all(RESULTS_DOC.read_text())
    if a.cmd == "check":
        if new != RESULTS_DOC.read_text():
            print("docs/results.md's GPU results tables are out of date: run `python ci/tools/readme_tables.py write`",
                  file=sys.stderr)
            return 1
        return 0
    RESULTS_DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
