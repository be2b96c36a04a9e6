"""Every published figure has a result document behind it, and the docs speak of the project.

BENCHMARKS.md and the README's headline table are rendered from docs/results/ by
tools/render_benchmarks.py: a render that differs means a figure was edited by hand or a
document changed without a render. The README's headline rows are also read back on their
own: each row's link names a document, and each of its figures is a figure of one launch of
that document, with 0 wrong on both sides.
"""

# ruff: noqa: E501 (a raw table of the CLI is quoted as it prints, wider than 100)
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


render = _tool("render_benchmarks")
rd = sys.modules["ipcshare.runtime.result_document"]
bench_logs = _tool("bench_logs")

# Words about how the work was organised, which a user of ipcshare never sees.
WORKPLACE = re.compile(r"\b(\w+ session|sessions?|lent|lending|was not lent|issue \d+)\b", re.I)
# Machine kinds named as a matter of availability rather than as hardware.
MACHINE_KIND = re.compile(r"nvidia-h[12]00(-x\d)?\b|(?<![-\w/.])x[1248](?![-\w/.])")
PROSE = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "tools" / "benchmarks-template.md",
]


def _headline_rows(readme: str) -> list:
    begin = readme.index(render.HEADLINE_BEGIN)
    end = readme.index(render.HEADLINE_END)
    lines = [
        line for line in readme[begin:end].splitlines() if line.startswith("| ") and "[`" in line
    ]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]


def _figures(cell: str) -> list:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell.replace(",", ""))]


def test_benchmarks_page_is_its_render():
    assert (ROOT / "docs" / "BENCHMARKS.md").read_text() == render.render_benchmarks()


def test_benchmarks_page_is_short_with_todays_figures_first():
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 800
    assert text.index("## Today's figures") < text.index("## History")


def test_readme_headline_table_is_its_render():
    readme = (ROOT / "README.md").read_text()
    assert render.readme_with_headline(readme) == readme


def test_every_readme_headline_figure_is_in_one_clean_launch_of_its_linked_document():
    rows = _headline_rows((ROOT / "README.md").read_text())
    assert len(rows) >= 10
    for machine, _call, ours, nccl, ratio in rows:
        link = re.search(r"\[`([0-9a-f]{7})`\]\((docs/results/[^)]+\.json)\)", machine)
        assert link, machine
        document = rd.load(ROOT / link.group(2))
        assert document["commit"]["id"].startswith(link.group(1))
        assert document["date"][:10] in machine
        launches: dict = {}
        for row in render.view(document)["rows"]:
            launches.setdefault(row["launch"], []).append(row)

        def holds(launch_rows, ours=ours, nccl=nccl, ratio=ratio):
            pairs = [(r, b) for r in launch_rows for b in r["baselines"]]
            return (
                set(_figures(ours)) <= {r["ours_us"] for r in launch_rows}
                and set(_figures(nccl)) <= {b["us"] for _, b in pairs}
                and set(_figures(ratio)) <= {render.ratio(r, b) for r, b in pairs}
            )

        def described(launch_rows, call=_call):
            """The row's words name the launch's timing, splits, arrays and algorithm."""
            row = launch_rows[0]
            splits = row.get("splits") or ""
            return (
                ("CUDA graph" in call or "one graph" in call) == (row["mode"] == "graph")
                and all(f"{kind} splits" not in call or kind in splits
                        for kind in ("even", "random", "skewed"))
                and ("registered" in call) == ("registered" in splits)
                and (f"`{row['algorithm']}`" in call or row["op"] == "moe-step"
                     or row["algorithm"] == "default")
            )

        matching = [rows_ for rows_ in launches.values() if holds(rows_) and described(rows_)]
        assert matching, f"no launch of {link.group(2)} holds {_call}: {ours} / {nccl} / {ratio}"
        assert any(render.clean(rows_) for rows_ in matching), f"{link.group(2)}: wrong elements"


def _document(baseline_wrong: int) -> dict:
    row = rd.make_row(
        op="allreduce", size=8, algorithm="ll", mode="graph", world_size=2, launch="x.log#1",
        ours=rd.figure(3.0), wrong=0,
        baselines=[rd.baseline_figure("nccl", 4.0, wrong=baseline_wrong)])
    return rd.make_document(
        tool="test", version="0.1.0", commit={"id": "abcdef0", "dirty": None, "source": "unknown"},
        machine={"hostname": "h", "host_cpus": 2, "gpu_model": None, "gpu_count": 0,
                 "links": None, "driver": None, "cuda": None, "nccl": None, "torch": None},
        command="ipcshare allreduce", exit_status=3 if baseline_wrong else 0, world_size=2,
        rows=[row], date="2026-01-01T00:00:00Z")


def test_a_headline_launch_with_wrong_elements_is_refused(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    rd.write(tmp_path / "m" / "clean.json", _document(0))
    rd.write(tmp_path / "m" / "wrong.json", _document(2))
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    assert render.headline_cells(render.Headline("m", "call", "m/clean.json", 1))[2:] == [
        "3.0 µs", "4.0 µs", "1.33"]
    with pytest.raises(ValueError, match="no clean rows"):
        render.headline_cells(render.Headline("m", "call", "m/wrong.json", 1))


def test_every_result_document_is_valid_and_says_where_its_commit_comes_from():
    paths = sorted((ROOT / "docs" / "results").rglob("*.json"))
    assert paths
    for path in paths:
        document = rd.load(path)
        assert re.fullmatch(r"[0-9a-f]{7,40}", document["commit"]["id"]), path
        assert path.name.startswith(f"{document['date'][:10]}-{document['commit']['id'][:7]}-")
        if document["commit"]["source"] in ("git", "given"):
            continue   # written by the run itself, which named its commit
        # Converted from raw output: where the commit came from, and that output.
        assert document["extra"]["commit_from"] and document["extra"]["raw"], path
        assert all((ROOT / raw).exists() for raw in document["extra"]["raw"]), path


def test_log_table_is_read_with_its_launch_and_baseline():
    text = """===== timer allreduce graph n=2 vs nccl (04:03:53, limit 150s)
+ timer_case 2 allreduce graph
# ipcshare 0.1.0  op: allreduce  backend: cuda-vmm  exchange: pidfd  ranks: 2  nodes: 1  iters: 50  warmup: 5  checks: 1  timing: graph (50 operations per graph)
#
#                                     out-of-place                          in-place  NCCL called directly (nccl4py) baseline
#          size         count     type       time   algbw   busbw #wrong       time   algbw   busbw #wrong       time   busbw #wrong speedup      path
#           (B)    (elements)                (us)  (GB/s)  (GB/s)              (us)  (GB/s)  (GB/s)              (us)  (GB/s)            (x) (fastest)
              8             2  float32       3.42    0.00    0.00      0       3.40    0.00    0.00      0       3.99    0.00      0    1.16 symmetric
# Measurement errors   : 0 OK
"""
    _context, launches = bench_logs.parse_log(text)
    (launch,) = launches
    assert launch.step == "timer allreduce graph n=2 vs nccl"
    assert launch.header["timing"].startswith("graph")
    assert launch.measurement_errors == 0
    row = launch.rows[0]
    assert row["out-of-place"]["time"] == "3.42" and row["in-place"]["time"] == "3.40"
    baseline = row["baseline:NCCL called directly (nccl4py)"]
    assert (
        baseline["time"] == "3.99"
        and baseline["speedup"] == "1.16"
        and baseline["path"] == "symmetric"
    )


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.name)
def test_docs_speak_of_the_project_not_the_workplace(path):
    offending = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if WORKPLACE.search(line) or MACHINE_KIND.search(line)
    ]
    assert not offending, "\n".join(offending)


def test_tools_speak_of_the_project_not_the_workplace():
    offending = []
    for path in sorted((ROOT / "tools").rglob("*")):
        if path.suffix in (".py", ".sh", ".md", ".cu", ".yaml"):
            # A pattern that strips such words from old commit subjects names them.
            offending += [f"{path.name}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                          if WORKPLACE.search(line) and "re.compile(" not in line]
    assert not offending, offending


# In code, pytest's own `request.session` is no workplace word: only the phrases are refused.
CODE_WORKPLACE = re.compile(r"\b(\w+ session|sessions|lent|lending|issue \d+)\b|nvidia-h[12]00", re.I)


def test_code_and_tests_speak_of_the_project():
    this = Path(__file__).resolve()
    offending = []
    for folder in ("ipcshare", "tests"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".cu", ".cuh", ".h", ".yaml") or path == this:
                continue
            offending += [f"{path.relative_to(ROOT)}:{n}"
                          for n, line in enumerate(path.read_text().splitlines(), 1)
                          if CODE_WORKPLACE.search(line)]
    assert not offending, offending


def test_result_documents_speak_of_the_project():
    offending = [path.name for path in sorted((ROOT / "docs" / "results").rglob("*.json"))
                 if WORKPLACE.search(path.read_text())]
    assert not offending, offending


# Sentences that said a thing had not been measured, each contradicted by a committed log.
STALE = [
    (re.compile(r"not yet run on a GPU|has not run on a GPU", re.I), "docs/*.md"),
    (re.compile(r"auto does not run (ll128|push)", re.I), "BENCHMARKS.md"),
    (re.compile(r"no GPU figures yet", re.I), "docs/*.md"),
    (re.compile(r"to be (re-)?measured", re.I), "docs/*.md"),
    (re.compile(r"NCCL (?:leads|wins) every collective", re.I), "README.md"),
]


@pytest.mark.parametrize("pattern", [p for p, _ in STALE], ids=[p.pattern for p, _ in STALE])
def test_no_stale_not_measured_sentence(pattern):
    offending = [
        f"{path.name}:{n}"
        for path in PROSE
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offending, offending


def _table(step: str, errors: int) -> str:
    return f"""===== {step} (00:00:01, limit 60s)
# ipcshare 0.1.0  op: allreduce  backend: cuda-vmm  exchange: pidfd  ranks: 4  nodes: 1  iters: 50  warmup: 5  checks: 1  timing: graph (50 operations per graph)
#
#                                     out-of-place                          in-place  NCCL called directly (nccl4py) baseline
#          size         count     type       time   algbw   busbw #wrong       time   algbw   busbw #wrong       time   busbw #wrong speedup      path
#           (B)    (elements)                (us)  (GB/s)  (GB/s)              (us)  (GB/s)  (GB/s)              (us)  (GB/s)            (x) (fastest)
              8             2  float32       6.05    0.00    0.00      0       6.10    0.00    0.00      0       3.95    0.00      0    0.65 symmetric
             32             8  float32       6.54    0.00    0.00      0       6.50    0.00    0.00      0       4.11    0.00      0    0.63 symmetric
# Measurement errors   : {errors}{' OK' if not errors else ''}
{step}                                   ok                        9s
"""


@pytest.fixture
def convert(tmp_path, monkeypatch):
    module = _tool("convert_bench_results")
    monkeypatch.setattr(module, "RAW", tmp_path)
    return module


def test_a_launch_with_measurement_errors_is_exit_5_whatever_a_summary_says(tmp_path, convert):
    folder = tmp_path / "gpu-check-h200-x4-2026-11-28"
    folder.mkdir()
    step = "allreduce ll-two-shot n=4 graph vs nccl"
    (folder / "4-log.txt").write_text(_table(step, 2))
    (folder / "4-summary.txt").write_text(f"{step}     rc=0      9s (at 9s)\n")
    (document,), why = convert.convert_file(folder / "4-log.txt")
    assert why is None
    assert document["exit_status"] == 5
    assert document["commit"]["id"].startswith("5cdb567")
    assert "4-summary.txt" in document["extra"]["commit_from"]
    first, *rest = [r for r in document["rows"] if r["placement"] == "out-of-place"]
    assert first["algorithm"] == "ll-two-shot" and first["mode"] == "graph"
    assert first["ours"]["time_us"] == 6.05 and first["baselines"][0]["time_us"] == 3.95
    assert first["details"]["speedup"] == {"nccl": 0.65}
    assert first["errors"] and not any(r["errors"] for r in rest)
    view = render.view(document)
    assert not render.clean(view["rows"])


def test_a_raw_file_without_a_commit_is_left_out_with_its_reason(tmp_path, convert):
    (tmp_path / "gpu-check-h200-x2-unknown.log").write_text(_table("timer allreduce graph n=4", 0))
    documents, why = convert.convert_file(tmp_path / "gpu-check-h200-x2-unknown.log")
    assert documents == [] and "no commit" in why


def test_json_lines_of_a_converted_log_are_not_converted_twice(tmp_path, convert):
    (tmp_path / "gpu-check-h200-x4-abcdef1.log").write_text(_table("timer allreduce graph n=4", 0))
    run = {"op": "allreduce", "world_size": 4, "timing": "graph", "rows": [
        {"size": 8, "time_us": 6.049, "wrong": 0}, {"size": 32, "time_us": 6.541, "wrong": 0}]}
    (tmp_path / "gpu-h200-x4-abcdef1.jsonl").write_text(json.dumps(run) + "\n")
    documents, why = convert.convert_file(tmp_path / "gpu-h200-x4-abcdef1.jsonl")
    assert documents == [] and "gpu-check-h200-x4-abcdef1.log" in why
    run["rows"][0]["time_us"] = 7.5  # other figures: another launch, converted on its own
    (tmp_path / "gpu-h200-x4-abcdef1.jsonl").write_text(json.dumps(run) + "\n")
    documents, why = convert.convert_file(tmp_path / "gpu-h200-x4-abcdef1.jsonl")
    assert documents == [] and "no date" in why  # not committed: no day to give it
