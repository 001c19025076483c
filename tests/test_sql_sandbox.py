"""`traceq sql` cannot touch the host (issue 34): 60 statements an attacker (or a careless
query) might try, on a store and on a dataset. Each is refused in one line; afterwards no file
was written, the store is byte for byte as before, and ordinary queries still work."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from conftest import sample
from typer.testing import CliRunner

from traceq.cli import app

runner = CliRunner()


def _attacks(out: Path) -> list[str]:
    """Statements that would write, read outside the store, reach the network, load code or
    change the session; `out` is where a write would land."""
    f = str(out / "pwned")
    return [
        f"COPY (SELECT 1) TO '{f}.csv'",
        f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{f}.csv'",
        f"EXPLAIN ANALYZE COPY (SELECT * FROM kernel_names) TO '{f}.parquet' (FORMAT parquet)",
        f"EXPLAIN COPY (SELECT 1) TO '{f}.csv'",
        f"/* comment */ EXPLAIN ANALYZE COPY (SELECT 1) TO '{f}.csv'",
        f"explain (format json) COPY (SELECT 1) TO '{f}.csv'",
        f"COPY kernel_names TO '{f}.json'",
        f"EXPORT DATABASE '{f}_dir'",
        "INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL httpfs", "LOAD '/tmp/evil.duckdb_extension'",
        "EXPLAIN ANALYZE INSTALL httpfs",
        "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_csv_auto('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_blob('/etc/hostname')",
        "SELECT * FROM '/etc/passwd'", "SELECT * FROM glob('/etc/*')",
        "SELECT * FROM read_json('/etc/hosts')", "SELECT * FROM read_parquet('/nonexistent/*.parquet')",
        "SELECT * FROM 'https://example.com/data.csv'", "SELECT * FROM read_csv('s3://bucket/x.csv')",
        "SELECT * FROM sqlite_scan('/etc/passwd', 't')",
        f"ATTACH '{f}.db' AS x", f"ATTACH '{f}.db' AS x (READ_ONLY)", "ATTACH ':memory:' AS m",
        "DETACH store", "USE memory; CREATE TABLE t AS SELECT 1",
        "SET enable_external_access = true", "RESET enable_external_access",
        "SET lock_configuration = false", "PRAGMA enable_external_access=true",
        "SET allowed_directories = ['/']", "SET threads = 64", "SET memory_limit = '100GB'",
        "SET temp_directory = '/tmp/x'", "PRAGMA disable_checkpoint_on_shutdown",
        "CREATE SECRET s (TYPE S3, KEY_ID 'a', SECRET 'b')", "CREATE PERSISTENT SECRET s2 (TYPE S3)",
        "CREATE TABLE t AS SELECT 1", "CREATE VIEW v AS SELECT 1", "CREATE MACRO m() AS 1",
        "INSERT INTO kernel_names VALUES (1, 0, 'x', 'x', NULL)", "UPDATE traces SET name = 'x'",
        "DELETE FROM kernel_events", "DROP TABLE kernel_events", "ALTER TABLE traces ADD COLUMN x INT",
        "TRUNCATE kernel_events", "CHECKPOINT", "VACUUM", "BEGIN TRANSACTION",
        "CALL enable_logging()", "CREATE SEQUENCE s", "SELECT 1; DROP TABLE kernel_events",
        "SELECT 1; SELECT 2", "IMPORT DATABASE '/tmp'", f"COPY traces FROM '{f}.csv'",
        "SELECT * FROM duckdb_extensions() WHERE loaded AND extension_name = 'httpfs'; LOAD httpfs",
        "SUMMARIZE SELECT * FROM read_csv('/etc/passwd')",
        "DESCRIBE SELECT * FROM read_text('/etc/hostname')",
        "WITH x AS (SELECT * FROM read_text('/etc/hostname')) SELECT * FROM x",
    ]


ORDINARY = ["SELECT count(*) AS n FROM kernels", "SELECT name, sum(dur_ns) AS ns FROM kernels GROUP BY 1 ORDER BY 2 DESC LIMIT 3",
            "DESCRIBE kernels", "SHOW TABLES", "SUMMARIZE SELECT dur_ns FROM kernels",
            "EXPLAIN SELECT count(*) FROM kernels", "EXPLAIN ANALYZE SELECT count(*) FROM kernels",
            "FROM traces SELECT name", "WITH k AS (SELECT * FROM kernels) SELECT count(*) FROM k"]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "s.duckdb"
    result = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--db", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_there_are_enough_attacks(tmp_path: Path) -> None:
    assert len(_attacks(tmp_path)) >= 50


@pytest.mark.parametrize("where", ["store", "dataset"])
def test_every_attack_is_refused_in_one_line_and_nothing_changes(where: str, store: Path, tmp_path: Path) -> None:
    if where == "dataset":
        pytest.importorskip("distributed")
        target = tmp_path / "ds"
        loaded = runner.invoke(app, ["load", str(sample("lenet_b256_cudnn.sqlite")), "--dataset", str(target),
                                     "--workers", "1"])
        assert loaded.exit_code == 0, loaded.output
        where_args = ["--dataset", str(target)]
        folder = target
    else:
        where_args = ["--db", str(store)]
        folder = store.parent
        target = store
    out = tmp_path / "out"
    out.mkdir()
    before = _digest(folder)
    cwd = os.getcwd()
    os.chdir(out)  # a relative path in an attack would land here
    import traceq

    store_api = traceq.open(dataset=target) if where == "dataset" else traceq.open(store)
    try:
        for i, attack in enumerate(_attacks(out)):
            if i % 4 == 0:  # a quarter through the command line, whole: exit status and the one line on stderr
                result = runner.invoke(app, ["sql", attack, *where_args])
                assert result.exit_code == 1, (attack, result.output)
                assert result.stderr.startswith("traceq: sql: ") and result.stderr.count("\n") == 1, \
                    (attack, result.stderr)
                assert "root:" not in result.output  # /etc/passwd's first line
            else:  # the rest through the API the command calls (Store.sql): the same sandbox, the same line
                with pytest.raises(traceq.TraceqError) as e:
                    store_api.sql(attack)
                assert str(e.value).startswith("sql: ") and "\n" not in str(e.value), attack
    finally:
        store_api.close()
        os.chdir(cwd)
    assert list(out.iterdir()) == []
    assert _digest(folder) == before
    for query in ORDINARY:
        result = runner.invoke(app, ["sql", query, *where_args, "-f", "csv"])
        assert result.exit_code == 0, (query, result.output)


def test_a_nested_column_prints_as_csv_and_json(store: Path) -> None:
    result = runner.invoke(app, ["sql", "SELECT [1, 2] AS l, {'a': 1} AS s", "--db", str(store), "-f", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["l,s", '"[1, 2]","{""a"": 1}"']
