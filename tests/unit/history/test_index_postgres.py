"""`history --store postgresql://...`: the index in a real PostgreSQL server gives the CSV path's answers and takes
concurrent ingests. The server: HARNESS_TEST_POSTGRES_URL, else a throwaway cluster this module starts with the
installed PostgreSQL's initdb (Debian: apt-get install postgresql); skipped, with the reason, where neither is."""

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest

from harness.cli.main import main
from harness.history.index import open_index
from harness.history.stored import load_history, summarize
from tests.unit.history.test_index import assert_same, csv_answers, index_answers, run_machines, write_history

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'psycopg[binary]')")


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd  # initdb refuses to run as root


@pytest.fixture(scope="module")
def server():
    url = os.environ.get("HARNESS_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    initdb = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or [shutil.which("initdb")]
    if not initdb[-1]:
        pytest.skip("no PostgreSQL server installed (apt-get install postgresql) and no HARNESS_TEST_POSTGRES_URL")
    bin_dir = os.path.dirname(initdb[-1])
    home = tempfile.mkdtemp(prefix="harness-pg-")
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
    with socket.socket() as s:  # a free port; the server listens on a socket in `home` only
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = os.path.join(home, "data")
    subprocess.run(_as_postgres([f"{bin_dir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres([f"{bin_dir}/pg_ctl", "-D", data, "-w", "-l", os.path.join(home, "log"), "-o",
                                 f"-k {home} -p {port} -c listen_addresses=''", "start"]), check=True,
                   capture_output=True)
    try:
        yield f"postgresql://postgres@/postgres?host={home}&port={port}"
    finally:
        subprocess.run(_as_postgres([f"{bin_dir}/pg_ctl", "-D", data, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def database(server):
    """A new, empty database on the server for one test."""
    name = f"h{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.replace("/postgres?", f"/{name}?")


def test_the_postgres_index_answers_as_the_csvs_do(tmp_path, database, capsys):
    root = write_history(tmp_path)
    index, ix = index_answers(root, database)
    assert len(ix.ingested) == 15 and ix.manifests["broken"]["status"] == "refused"
    assert_same(csv_answers(root), index)
    assert open_index(root, database).ingested == []  # read once
    assert main(["history", str(root), "--store", database, "--testbed", "tb-a", "--changes"]) == 0
    assert "3 change point(s) in 3 of 3 key(s)" in capsys.readouterr().out


def test_concurrent_ingests_into_postgres_lose_no_run(tmp_path, database):
    root = tmp_path / "results"
    assert run_machines(root, database, 3, 4) == [0] * 3
    ix = open_index(root, database)
    assert len(ix.manifests) == 12 and ix.summary().equals(summarize(load_history(root)))
    assert len(ix.rows(("run_id", "case_id"))) == 12 * 3  # no run's rows inserted twice


def test_a_bad_url_is_one_line_naming_it(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(ValueError, match="--store 'postgresql://nobody@/x\\?host=/nonexistent': cannot connect"):
        open_index(tmp_path / "r", "postgresql://nobody@/x?host=/nonexistent")
