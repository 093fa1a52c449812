"""The command line: ``verify`` reports a root per table and exits 1 when it is damaged."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

from dbsp_pipeline import Circuit, Pipeline
from dbsp_pipeline.cli import main
from tests.object_store_helpers import new_bucket


def test_verify_reports_each_table_and_exits_1_on_damage(spark, tmp_path, capsys):
    c = Circuit("cli")
    x = c.input("x", "k BIGINT")
    c.output("n", x.group_by("k").agg(n="count(*)"))
    root = str(tmp_path / "root")
    with Pipeline(c, root, spark) as p:
        p.push("x", [(1,), (2,)])
        p.step()
    assert main(["verify", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "ok" in out.splitlines()[0]
    assert all(t in out for t in ("_manifest", "_divisions", "inputs/x", "outputs/n", "state/"))

    commit = max(glob.glob(os.path.join(root, "_divisions", "_delta_log", "*.json")))
    open(commit, "w").close()
    done = subprocess.run([sys.executable, "-m", "dbsp_pipeline", "verify", "--root", root,
                           "--json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert not report["ok"] and report["newest_intact"] is None
    [divisions] = [t for t in report["tables"] if t["table"] == "_divisions"]
    assert divisions["damage"][0]["file"] == commit
    assert "empty" in divisions["damage"][0]["problem"]

    assert main(["verify", "--root", str(tmp_path / "nothing")]) == 2


def test_verify_reports_an_s3_root(spark, object_store, tmp_path, monkeypatch, capsys):
    """The same report for ``s3://bucket/prefix`` (a real SeaweedFS): ok, then the emptied
    commit named, exit 1; a prefix with nothing under it is no root (exit 2)."""
    from pyarrow import fs

    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    c = Circuit("cli")
    x = c.input("x", "k BIGINT")
    c.output("n", x.group_by("k").agg(n="count(*)"))
    bucket = new_bucket(object_store, "cli")
    root = f"s3://{bucket}/root"
    with Pipeline(c, root, spark) as p:
        p.push("x", [(1,), (2,)])
        p.step()
    assert main(["verify", "--root", root]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"pipeline root {root}: ok"
    assert all(t in out for t in ("_manifest", "_divisions", "inputs/x", "outputs/n", "state/"))

    s3 = fs.S3FileSystem(access_key=object_store["AWS_ACCESS_KEY_ID"],
                         secret_key=object_store["AWS_SECRET_ACCESS_KEY"],
                         endpoint_override=object_store["AWS_ENDPOINT_URL"].removeprefix(
                             "http://"), scheme="http", region=object_store["AWS_REGION"])
    log = f"{bucket}/root/_divisions/_delta_log"
    newest = max(i.path for i in s3.get_file_info(fs.FileSelector(log))
                 if i.path.endswith(".json"))
    with s3.open_output_stream(newest) as out_stream:
        out_stream.write(b"")
    assert main(["verify", "--root", root, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [divisions] = [t for t in report["tables"] if t["table"] == "_divisions"]
    assert divisions["damage"][0]["file"] == f"s3://{newest}"
    assert "empty" in divisions["damage"][0]["problem"]

    assert main(["verify", "--root", f"s3://{bucket}/nothing"]) == 2


def test_demo_and_verify_find_an_s3_root(spark, object_store, monkeypatch, capsys, tmp_path):
    """An object-store root is looked for in its store, not on the local disk: ``demo`` starts
    it afresh unless ``--keep``, and ``verify`` finds it there."""
    for name, value in object_store.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    root = f"s3://{new_bucket(object_store, 'cli')}/demo"
    assert main(["verify", "--root", root]) == 2
    assert "no pipeline root" in capsys.readouterr().err
    demo = ["demo", "--root", root, "--steps", "1", "--batch", "20"]
    for args, next_step in ((demo, 0), (demo + ["--keep"], 1), (demo, 0)):
        assert main(args) == 0
        out = capsys.readouterr().out
        assert f"next step {next_step}\n" in out and "revenue_by_region:\nregion" in out
        assert "a step on average: divide " in out and "slowest operators: n" in out
    assert main(["verify", "--root", root]) == 0
    assert "no pipeline root" not in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_verify_finds_no_root_in_a_folder_where_no_pipeline_was_opened(tmp_path, capsys):
    (tmp_path / "inputs").mkdir()
    assert main(["verify", "--root", str(tmp_path)]) == 2
    assert "no pipeline root" in capsys.readouterr().err


def test_demo_deletes_its_own_pipeline_only(spark, tmp_path, capsys):
    """The demo starts afresh by deleting its root: a root of its own pipeline, or an empty
    folder; a folder holding anything else is refused, and nothing in it is touched."""
    precious = tmp_path / "mine"
    (precious / "sub").mkdir(parents=True)
    (precious / "notes.txt").write_text("precious")
    demo = ["demo", "--steps", "1", "--batch", "20"]
    assert main(demo + ["--root", str(precious)]) == 2
    assert "holds something else than the demo's pipeline" in capsys.readouterr().err
    assert (precious / "notes.txt").read_text() == "precious" and (precious / "sub").is_dir()
    (tmp_path / "empty").mkdir()
    for root, next_step in ((tmp_path / "empty", 0), (tmp_path / "empty", 0),
                            (tmp_path / "new", 0)):
        assert main(demo + ["--root", str(root)]) == 0
        assert f"next step {next_step}\n" in capsys.readouterr().out
    (tmp_path / "new" / "notes.txt").write_text("mine")  # beside a demo pipeline
    assert main(demo + ["--root", str(tmp_path / "new")]) == 2
    assert "holds the demo's pipeline and other files (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "new" / "notes.txt").read_text() == "mine"


def test_status_reads_a_root_without_opening_it(spark, tmp_path, capsys):
    """``status`` says what a root holds (inputs and what waits in them, views, next step,
    checkpoints) without opening it: a pipeline running it is not fenced."""
    from dbsp_pipeline import Pipeline
    from dbsp_pipeline.examples.shop import shop_circuit

    root = str(tmp_path / "shop")
    assert main(["status", "--root", root]) == 2
    assert "no pipeline root" in capsys.readouterr().err
    with Pipeline(shop_circuit(), root, spark, checkpoint_every=1) as p:
        p.push("customers", [(1, "north")])
        p.step()
        p.push("orders", [(1, 1, 30.0)])
        p.push("orders", [(2, 1, 40.0)])
        assert main(["status", "--root", root]) == 0  # while it is open: it goes on after
        out = capsys.readouterr().out
        p.step()
    assert "circuit 'shop', state version 1 (taken before step 1), 1 steps divided" in out, out
    assert "input orders: log version 2, 2 pushes not yet in a step" in out, out
    assert "input customers: log version 1, nothing waits" in out, out
    assert "views: idle_customers, regions, revenue_by_region" in out, out
    assert "checkpoints (newest first): 1 (after step 0), 0 (before any step)" in out, out
    assert main(["status", "--root", root, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["next_step"] == 2 and report["divided_steps"] == 2
    assert report["inputs"]["orders"] == {"log_version": 2, "pending_pushes": 0}
