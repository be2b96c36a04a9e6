"""The result document's schema: what it accepts, what it refuses (field by field, each
error naming the field), atomic writes, and the docs' field table against the schema."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from ipcshare.runtime import result_document as rd
from ipcshare.topology.machine_facts import (
    describe_links,
    links_from_topology,
    visible_gpu_indices,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "CLI.md"


def _machine() -> dict:
    return {"hostname": "node7", "host_cpus": 224, "gpu_model": "NVIDIA H200", "gpu_count": 4,
            "links": "NVLink 4: 18 links per GPU, all 6 pairs", "driver": "580.95.05",
            "cuda": "13.0", "nccl": "2.28.9", "torch": None}


def _document(**changes) -> dict:
    launch = rd.new_launch_id()
    rows = [rd.make_row(op="allreduce", size=size, count=size // 4, dtype="float32",
                        algorithm="auto", mode="graph", world_size=4, launch=launch,
                        ours=rd.figure(7.5, 1.0, 1.5, wall_us=8.0),
                        baselines=[rd.baseline_figure("nccl", 14.0, 0.5, 0.8,
                                                      version="NCCL 2.28.9")],
                        details={"backend": "cuda-vmm"})
            for size in (8192, 32768)]
    fields = dict(tool="ipcshare allreduce", version="0.1.0",
                  commit={"id": "a" * 40, "dirty": False, "source": "git"},
                  machine=_machine(), command="mpiexec -n 4 ipcshare allreduce",
                  exit_status=0, world_size=4, rows=rows)
    fields.update(changes)
    return rd.make_document(**fields)


def test_a_whole_document_passes_and_round_trips(tmp_path):
    document = _document()
    assert document["wrong_total"] == 0 and document["measurement_errors"] == []
    assert {row["launch"] for row in document["rows"]} == {document["rows"][0]["launch"]}
    path = tmp_path / "result.json"
    rd.write(path, document)
    assert rd.load(path) == document
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left
    assert path.stat().st_mode & 0o777 == 0o644


def test_wrong_total_and_errors_are_gathered_from_the_rows():
    launch = rd.new_launch_id()
    rows = [rd.make_row(op="allgather", size=64, algorithm="ll", mode="eager", world_size=2,
                        launch=launch, ours=rd.figure(3.0, 1.0, 0.5), wrong=2,
                        baselines=[rd.baseline_figure("nccl", 9.0, wrong=5)],
                        errors=["timer disagrees with the host clock"])]
    document = _document(rows=rows, exit_status=3)
    assert document["wrong_total"] == 7
    assert document["measurement_errors"] == ["timer disagrees with the host clock"]
    assert document["rows"][0]["baselines"][0]["time_us"] is None  # a wrong one has no time
    assert rd.document_exit_status(document) == 3


def test_unverified_runs_count_no_wrong_elements():
    launch = rd.new_launch_id()
    rows = [rd.make_row(op="ring", size=64, algorithm="auto", mode="eager", world_size=2,
                        launch=launch, ours=rd.figure(3.0, 1.0, 1.0), wrong=None)]
    assert _document(rows=rows)["wrong_total"] is None


def _set(document: dict, path: str, value) -> None:
    keys = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    target = document
    for key in keys[:-1]:
        target = target[key]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value


@pytest.mark.parametrize("path, value, message", [
    ("schema", "ipcshare.result/0", "schema: expected 'ipcshare.result/1'"),
    ("schema", KeyError, "schema: missing"),
    ("tool", 3, "tool: expected a string"),
    ("commit.id", "", "commit.id: must not be empty"),
    ("commit.dirty", "yes", "commit.dirty: expected true or false or null"),
    ("commit.source", "svn", "commit.source: expected one of git, given, package, unknown"),
    ("machine.gpu_count", -1, "machine.gpu_count: must not be negative"),
    ("machine.links", KeyError, "machine.links: missing"),
    ("machine.colour", "red", "machine.colour: not a field"),
    ("date", "2026-12-06 06:50", "date: expected UTC ISO 8601"),
    ("command", "", "command: must not be empty"),
    ("exit_status", "0", "exit_status: expected an integer"),
    ("world_size", 0, "world_size: must be at least 1"),
    ("rows", {}, "rows: expected a list"),
    ("rows[1].op", "", "rows[1].op: must not be empty"),
    ("rows[0].size", -8, "rows[0].size: must not be negative"),
    ("rows[0].size", 8.5, "rows[0].size: expected an integer"),
    ("rows[0].mode", "warm", "rows[0].mode: expected one of eager, graph, latency"),
    ("rows[0].placement", "both", "rows[0].placement: expected one of out-of-place"),
    ("rows[0].launch", KeyError, "rows[0].launch: missing"),
    ("rows[0].ours.time_us", "fast", "rows[0].ours.time_us: expected a number or null"),
    ("rows[0].ours.time_us", 0.0, "rows[0].ours.time_us: must be positive"),
    ("rows[0].ours.busbw", float("nan"), "rows[0].ours.busbw: expected a number or null"),
    ("rows[0].baselines[0].name", "", "rows[0].baselines[0].name: must not be empty"),
    ("rows[0].baselines[0].wrong", 4, "rows[0].baselines[0].time_us: a baseline with 4 wrong"),
    ("rows[0].errors", ["ceiling"], "measurement_errors: lacks rows[0]'s 'ceiling'"),
    ("rows[0].wrong", 3, "wrong_total: 0, but the rows count 3"),
    ("wrong_total", None, "wrong_total: None, but the rows count 0"),
    ("measurement_errors", ["timer"], "exit_status: 0, but the document lists measurement"),
])
def test_each_broken_field_is_refused_by_name(path, value, message):
    document = copy.deepcopy(_document())
    _set(document, path, value)
    with pytest.raises(rd.DocumentError) as caught:
        rd.validate(document)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_row_needs_a_figure_and_exit_0_needs_nothing_wrong():
    document = _document()
    document["rows"][0]["ours"] = None
    document["rows"][0]["baselines"] = []
    with pytest.raises(rd.DocumentError, match=r"^rows\[0\]: no figure"):
        rd.validate(document)
    document = _document()
    document["rows"][0]["wrong"] = 1
    document["wrong_total"] = 1
    with pytest.raises(rd.DocumentError, match="^exit_status: 0, but wrong_total is 1"):
        rd.validate(document)


def test_write_refuses_a_broken_document_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    rd.write(path, _document())
    before = path.read_text()
    broken = _document()
    broken["rows"][0]["mode"] = "warm"
    with pytest.raises(rd.DocumentError):
        rd.write(path, broken)
    assert path.read_text() == before
    assert len(list(tmp_path.iterdir())) == 1


def test_load_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(rd.DocumentError, match=r"broken\.json: not JSON"):
        rd.load(path)
    path.write_text(json.dumps({"schema": rd.SCHEMA}))
    with pytest.raises(rd.DocumentError, match=r"broken\.json: tool: missing"):
        rd.load(path)


def test_the_docs_table_lists_every_field_of_the_schema():
    text = DOCS.read_text()
    section = text.split("## Result documents", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))
    groups = [("", rd.DOCUMENT_FIELDS), ("commit.", rd.COMMIT_FIELDS),
              ("machine.", rd.MACHINE_FIELDS), ("rows[].", rd.ROW_FIELDS),
              ("rows[].ours.", rd.FIGURE_FIELDS),
              ("rows[].baselines[].", [f for f in rd.BASELINE_FIELDS
                                       if f not in rd.FIGURE_FIELDS])]
    expected = {prefix + field.name for prefix, fields in groups for field in fields}
    assert listed == expected
    example = section.split("```json\n", 1)[1].split("```", 1)[0]
    rd.validate(json.loads(example))


def test_command_line_and_launch_ids():
    assert rd.command_line(["ipcshare", "allreduce", "-b", "1 M"], 4) == \
        "mpiexec -n 4 ipcshare allreduce -b '1 M'"
    assert rd.command_line(["ipcshare", "info"]) == "ipcshare info"
    assert re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{8}", rd.new_launch_id())
    assert rd.new_launch_id() != rd.new_launch_id()


def test_links_are_told_in_one_line():
    assert describe_links([(18, 6)] * 4, 6, 6) == "NVLink 4: 18 links per GPU, all 6 pairs"
    assert describe_links([(18, 6)] * 4, 4, 6, (5, 16)) == \
        "NVLink 4: 18 links per GPU, 4 of 6 pairs (PCIe gen 5 x16 for the others)"
    assert describe_links([(0, 0)] * 2, 0, 1, (4, 16)) == "PCIe gen 4 x16, no NVLink"
    assert describe_links([(18, 6)], 0, 0) == "NVLink 4: 18 links per GPU (one GPU)"
    assert describe_links([], 0, 0) is None


def test_links_from_nvidia_smi_topology():
    # nvidia-smi topo -m on 4 H200s (its header is underlined with escape codes)
    text = ("\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\x1b[0m\n"
            "GPU0\t X \tNV18\tNV18\tNV18\t0-63\n"
            "GPU1\tNV18\t X \tNV18\tNV18\t0-63\n"
            "GPU2\tNV18\tNV18\t X \tSYS\t0-63\n"
            "GPU3\tNV18\tNV18\tSYS\t X \t0-63\n")
    assert links_from_topology(text, [0, 1, 2, 3]) == \
        "NVLink: 18 links a pair, 5 of 6 pairs (nvidia-smi topo)"
    assert links_from_topology(text, [0, 1]) == \
        "NVLink: 18 links a pair, all 1 pairs (nvidia-smi topo)"
    assert links_from_topology(text, [2, 3]) == "PCIe (SYS), no NVLink (nvidia-smi topo)"
    assert links_from_topology("no matrix", [0, 1]) is None


def test_visible_gpus_follow_cuda_visible_devices():
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert visible_gpu_indices(3, uuids, None) == [0, 1, 2]
    assert visible_gpu_indices(3, uuids, "2,0") == [2, 0]
    assert visible_gpu_indices(3, uuids, "GPU-b") == [1]
    assert visible_gpu_indices(3, uuids, "1,7,0") == [1]  # CUDA stops at a bad entry
    assert visible_gpu_indices(3, uuids, "") == []


def test_the_commit_of_a_copy_without_git_is_the_one_given(tmp_path, monkeypatch):
    from ipcshare.runtime import source_commit as sc
    from ipcshare.runtime.errors import SettingError

    monkeypatch.delenv("IPCSHARE_SOURCE_COMMIT", raising=False)
    assert sc.source_commit()["source"] == "git"   # this checkout
    # Given on purpose, it beats a git folder the copy may carry (of another commit).
    monkeypatch.setenv("IPCSHARE_SOURCE_COMMIT", "96097c8")
    assert sc.source_commit() == {"id": "96097c8", "dirty": False, "source": "given"}
    monkeypatch.setattr(sc, "_CHECKOUT", tmp_path)   # a copy of the tree, no .git
    monkeypatch.delenv("IPCSHARE_SOURCE_COMMIT", raising=False)
    assert sc.source_commit()["id"] in ("unknown", sc._from_package())
    monkeypatch.setenv("IPCSHARE_SOURCE_COMMIT", "3be84d4+dirty")
    assert sc.source_commit() == {"id": "3be84d4", "dirty": True, "source": "given"}
    monkeypatch.setenv("IPCSHARE_SOURCE_COMMIT", "main")
    with pytest.raises(SettingError, match="IPCSHARE_SOURCE_COMMIT='main': a commit hash"):
        sc.source_commit()
