"""The integration ships with the package: a wheel built from ``pyproject.toml`` holds
``dbsp_pipeline.dagster``, and a user's own code location of a few lines, outside the
repository, loads from that wheel alone through ``dagster definitions validate``. Importing the
engine never imports Dagster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: a user's code location: their own circuit, the integration, a named deployment
USER_LOCATION = '''
import os

import dbsp_pipeline
from dbsp_pipeline import Circuit
from dbsp_pipeline.dagster import Deployment, PipelineSpec, build_definitions

# loaded from the installed wheel, not from a source tree
assert dbsp_pipeline.__file__.startswith(os.environ["EXPECTED_SITE"]), dbsp_pipeline.__file__

c = Circuit("signups")
users = c.input("users", "user_id BIGINT, country STRING")
c.output("per_country", users.group_by("country").agg(n="count(*)"))

defs = build_definitions([PipelineSpec(c, check_views=False)],
                         Deployment.local("data"))
'''


def test_importing_the_engine_does_not_import_dagster():
    out = subprocess.run([sys.executable, "-c", "import sys, dbsp_pipeline; "
                          "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                          "('dagster', 'confluent_kafka')))"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.stdout.strip() == "[]"


def test_a_user_code_location_loads_from_the_installed_wheel(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(os.path.join(REPO, name), source / name)
    shutil.copytree(os.path.join(REPO, "dbsp_pipeline"), source / "dbsp_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp_path / "wheels"), str(source)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "wheels").iterdir()
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    assert (site / "dbsp_pipeline" / "dagster" / "definitions.py").is_file()

    user = tmp_path / "my_project"
    user.mkdir()
    (user / "my_location.py").write_text(textwrap.dedent(USER_LOCATION))
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DBSP_")}
    env.update(PYTHONPATH=str(site), EXPECTED_SITE=str(site),
               DAGSTER_HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    out = subprocess.run([dagster, "definitions", "validate", "-f", "my_location.py"], cwd=user,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All code locations passed validation" in out.stdout + out.stderr
