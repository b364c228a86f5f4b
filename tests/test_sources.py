"""Token logs in object storage: `validate`, `replay` and the token inspector read `s3://` URIs from a local
S3 endpoint (moto's server on 127.0.0.1, started here; never the network)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from evaluator.cli import cli
from evaluator.logio import write_log_atomic
from evaluator.replay.pipeline import replay
from evaluator.store import connect_store, file_digest, open_store
from evaluator.trainer.synthetic import SyntheticSpec, synthetic_steps

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

BUCKET = "rl-logs"
TABLES = ("ingested_file", "file_tokens", "metric_moments", "sketch_by_step", "sketch_by_staleness")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 endpoint holding three logs of one run under `s3://rl-logs/run-a/` (and a note that is
    not Parquet), their local twins, and the client to change objects."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    local = tmp_path_factory.mktemp("s3_twins")
    spec = SyntheticSpec(run_id="run-a", seed=3, tokens_per_step=512, mean_length=24)
    for i in range(3):
        log = write_log_atomic(synthetic_steps(spec, 4 * i, 4), local / f"part-{i}.parquet")
        client.upload_file(str(log), BUCKET, f"run-a/rank0/{log.name}")
    client.put_object(Bucket=BUCKET, Key="run-a/README.txt", Body=b"not a log")
    yield client, local
    server.stop()
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


@pytest.fixture(scope="module")
def local_store(s3, tmp_path_factory) -> Path:
    """The local twins of the three objects replayed into a store (tests only read it)."""
    db = tmp_path_factory.mktemp("local_store") / "local"
    replay(sorted(s3[1].glob("*.parquet")), db, progress=False, workers=1)
    return db


def store_rows(db: Path) -> dict[str, list]:
    """Every stored row but where and when each file was read."""
    with connect_store(db) as con:
        return {
            t: con.execute(f"SELECT * EXCLUDE (path, ingested_at) FROM {t} ORDER BY ALL").fetchall()
            if t == "ingested_file"
            else con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall()
            for t in TABLES
        }


def test_replay_reads_a_prefix_and_stores_what_a_local_replay_stores(s3, local_store, tmp_path):
    _, local = s3
    report = replay([f"s3://{BUCKET}/run-a/"], tmp_path / "s3", progress=False, workers=1)
    uris = [f"s3://{BUCKET}/run-a/rank0/part-{i}.parquet" for i in range(3)]
    assert [(str(o.path), o.status) for o in report.outcomes] == [(u, "ingested") for u in uris]
    with connect_store(tmp_path / "s3") as con:
        recorded = con.execute("SELECT path, digest FROM ingested_file ORDER BY path").fetchall()
    assert recorded == [(u, file_digest(local / u.rsplit("/", 1)[1])) for u in uris]
    assert store_rows(tmp_path / "s3") == store_rows(local_store)
    # A file's identity is its bytes: the local twins of the objects are copies of what the store holds.
    again = replay(sorted(local.glob("*.parquet")), tmp_path / "s3", progress=False, workers=1)
    assert [(o.status, o.copy_of) for o in again.outcomes] == [("copy", u) for u in uris]


def test_validate_names_the_objects_and_their_problems(s3):
    client, local = s3
    broken = local / "broken.parquet"
    broken.write_bytes((local / "part-0.parquet").read_bytes()[:300])  # cut short
    client.upload_file(str(broken), BUCKET, "cut/broken.parquet")
    client.upload_file(str(local / "part-0.parquet"), BUCKET, "cut/part-0.parquet")
    result = CliRunner().invoke(cli, ["validate", f"s3://{BUCKET}/cut/", "--format", "json"])
    assert result.exit_code == 1, result.output
    reports = {r["path"]: r for r in json.loads(result.output)["files"]}
    assert reports[f"s3://{BUCKET}/cut/part-0.parquet"]["ok"]
    assert not reports[f"s3://{BUCKET}/cut/broken.parquet"]["readable"]
    one = CliRunner().invoke(cli, ["validate", f"s3://{BUCKET}/cut/part-0.parquet"])
    assert one.exit_code == 0 and f"s3://{BUCKET}/cut/part-0.parquet" in one.output


def test_a_token_in_two_objects_names_the_uri_that_holds_it_first(s3):
    client, local = s3
    for key in ("twice/a.parquet", "twice/b.parquet"):
        client.upload_file(str(local / "part-0.parquet"), BUCKET, key)
    result = CliRunner().invoke(cli, ["validate", f"s3://{BUCKET}/twice/", "--format", "json"])
    assert result.exit_code == 1, result.output
    second = {r["path"]: r for r in json.loads(result.output)["files"]}[f"s3://{BUCKET}/twice/b.parquet"]
    (problem,) = [p for p in second["problems"] if p["rule"] == "duplicate_across_files"]
    assert (
        f"s3://{BUCKET}/twice/a.parquet" in problem["message"] and "proxaudit-stage" not in problem["message"]
    )


@pytest.mark.parametrize(
    "uri, says",
    [
        (f"s3://{BUCKET}/nothing-here/", "no such object or prefix"),
        ("s3://no-such-bucket/x/", "s3://no-such"),
    ],
)
def test_a_missing_prefix_or_bucket_is_a_usage_error(s3, tmp_path, uri, says):
    for command in (["validate", uri], ["replay", uri, "--db", str(tmp_path / "m")]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        assert says in result.output
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    "uri",
    [
        f"s3://{BUCKET}/run-a/?endpoint_override=127.0.0.1:9&scheme=http",
        f"s3://test:test@{BUCKET}/run-a/",
        "s3://127.0.0.1:9/run-a/",
        "hdfs://127.0.0.1:9/run-a/",
        "http://127.0.0.1:9/run-a/part-0.parquet",
    ],
)
def test_a_uri_with_options_credentials_or_a_host_is_refused(s3, tmp_path, uri):
    """Options in a URI would be recorded in the store and followed by the token inspector: the endpoint
    and credentials come from the environment only."""
    for command in (["validate", uri], ["replay", uri, "--db", str(tmp_path / "m")]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        assert "s3://BUCKET/KEY or gs://BUCKET/KEY" in result.output and "AWS_ENDPOINT_URL" in result.output
    assert not (tmp_path / "m").exists()


def test_a_key_that_climbs_out_of_its_prefix_is_refused(s3, tmp_path):
    """An object's key is the bucket's data: a key with `..` would be sent as another bucket's object (the
    SDK collapses the segments) and could place a copy outside the staging folder; it is an error naming
    it, and nothing is written."""
    client, local = s3
    key = "climb/../../../../escaped.parquet"
    client.upload_file(str(local / "part-0.parquet"), BUCKET, key)
    try:
        result = CliRunner().invoke(cli, ["replay", f"s3://{BUCKET}/climb/", "--db", str(tmp_path / "m.db")])
    finally:
        client.delete_object(Bucket=BUCKET, Key=key)
    assert result.exit_code == 2 and f"s3://{BUCKET}/{key}: a key with a `.` or `..`" in result.output
    assert not (tmp_path / "m.db").exists()


def test_the_inspector_reads_an_object_only_while_it_holds_the_replayed_bytes(s3, tmp_path):
    from dashboard import inspector_queries

    client, local = s3
    key = "inspect/part-1.parquet"
    client.upload_file(str(local / "part-1.parquet"), BUCKET, key)
    db = tmp_path / "m"
    replay([f"s3://{BUCKET}/{key}"], db, progress=False, workers=1)
    step = 5
    files = inspector_queries.log_files(db, "run-a", step)
    assert files["path"].tolist() == [f"s3://{BUCKET}/{key}"] and files["reachable"].all()
    seqs = inspector_queries.sequences(db, "run-a", step)
    assert len(seqs) > 0
    tokens = inspector_queries.sequence_tokens(db, "run-a", step, int(seqs["seq_id"].iloc[0]))
    assert len(tokens) == int(seqs["n_tokens"].iloc[0])
    client.upload_file(str(local / "part-2.parquet"), BUCKET, key)  # other bytes under the same key
    assert not inspector_queries.log_files(db, "run-a", step)["reachable"].any()
    assert inspector_queries.sequences(db, "run-a", step).empty
    client.delete_object(Bucket=BUCKET, Key=key)
    assert not inspector_queries.log_files(db, "run-a", step)["reachable"].any()


def test_staged_copies_are_removed(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # take TMPDIR again
    replay([f"s3://{BUCKET}/run-a/"], tmp_path / "m", progress=False, workers=1)
    assert list((tmp_path / "tmp").iterdir()) == []
    shutil.rmtree(tmp_path / "tmp")


def test_uris_are_refused_with_a_ray_cluster_that_could_not_read_the_copies(s3, tmp_path):
    from evaluator.errors import UsageError

    with pytest.raises(UsageError, match="cluster's workers cannot read them"):
        replay([f"s3://{BUCKET}/run-a/"], tmp_path / "m", progress=False, ray="10.0.0.1:6379")


def test_a_store_keeps_its_data_files_on_object_storage(s3, local_store, tmp_path):
    """`--data-path s3://...`: the catalog stays in the folder, the Parquet files go to the bucket; readers
    find them from the catalog, and the store holds what a local one does."""
    pytest.importorskip("duckdb_extension_httpfs", reason="needs proxaudit[scale] (make install has it)")
    client, local = s3
    logs = sorted(local.glob("*.parquet"))
    replay(logs, tmp_path / "remote", progress=False, workers=1, data_path=f"s3://{BUCKET}/store/")
    assert store_rows(tmp_path / "remote") == store_rows(local_store)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="store/")["Contents"]]
    assert any(k.endswith(".parquet") and "/metric_moments/" in k for k in keys)
    assert not list((tmp_path / "remote").rglob("*.parquet"))  # nothing of the data is local
    with open_store(tmp_path / "remote") as con:
        assert con.execute("SELECT count(*) FROM run_summary").fetchone()[0] > 0
