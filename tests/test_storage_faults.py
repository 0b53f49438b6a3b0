"""Storage faults against a real S3-compatible server (moto's) on loopback, through real
``imgpack`` subprocesses and the readers: an unreachable endpoint, the server stopped
mid-upload, no credentials, permission denied (moto's IAM checks), a missing bucket; and,
through the readers, a server that drops or stalls the connection (a loopback socket).

Each is one line naming the URL and the cause, never a traceback (``--debug`` shows it);
the readers raise :class:`readers.StorageError`. Clients retry once here (AWS_MAX_ATTEMPTS)
so that the tests wait less; the messages are those of the default retries.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import readers
from convert import ConvertOptions, convert_folder
from readers import spec
from readers.storage.remote import RemoteFolder
from scripts.s3_server import S3Server, free_port, local_s3_server
from tests.conftest import SAMPLE_DATA

pytestmark = pytest.mark.server  # every test here runs against a loopback S3 server

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "imgpack-faults"
DATASET = f"s3://{BUCKET}/dataset"


@pytest.fixture(scope="module", autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A reader cache and staging folders of this module's own; one retry per request."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IMGPACK_CACHE_DIR", str(tmp_path_factory.mktemp("imgpack-cache")))
        patch.setenv("AWS_MAX_ATTEMPTS", "2")
        yield


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    """The server for this module, holding a dataset at DATASET."""
    with local_s3_server(BUCKET) as server:
        options = ConvertOptions("wds", shard_size=10)
        convert_folder(SAMPLE_DATA, DATASET, options, workers=1, progress=False)
        yield server


def imgpack(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """Run ``imgpack ARGS`` with the environment changed by ``env`` (None: unset)."""
    environ = {**os.environ, **(env or {})}
    environ = {k: v for k, v in environ.items() if v is not None}
    command = [sys.executable, "-m", "convert.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )


def one_line_error(stderr: str, returncode: int) -> str:
    """The error line of a failed command, checked to be the only line and no traceback."""
    assert returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    return lines[0]


def commands(src: Path | str, new: str) -> list[tuple[str, ...]]:
    """``convert`` into ``new``, and ``info`` and ``verify`` of the module's dataset."""
    convert = ("convert", str(src), new, "--format", "pt")
    return [convert, ("info", DATASET), ("verify", DATASET)]


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Environment changes for this process's S3 clients, undone afterwards (fsspec keeps
    one filesystem per set of options: each change needs a fresh one)."""
    s3 = fsspec.get_filesystem_class("s3")
    s3.clear_instance_cache()
    yield monkeypatch
    monkeypatch.undo()
    s3.clear_instance_cache()


def test_an_unreachable_endpoint_is_one_line_naming_the_url_and_endpoint(server, environment):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cause = f"cannot reach the storage endpoint {endpoint} (connection refused)"
    for args in commands(SAMPLE_DATA, f"s3://{BUCKET}/new"):
        result = imgpack(*args, env={"AWS_ENDPOINT_URL": endpoint})
        line = one_line_error(result.stderr, result.returncode)
        assert re.fullmatch(rf"Error: s3://{BUCKET}/\S+: {re.escape(cause)}", line), line
    debug = imgpack("--debug", "info", DATASET, env={"AWS_ENDPOINT_URL": endpoint})
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "EndpointConnectionError" in debug.stderr
    environment.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(readers.StorageError, match=f"{DATASET}/imgpack.json: {re.escape(cause)}"):
        readers.open_dataset(DATASET)
    with pytest.raises(readers.StorageError, match=re.escape(cause)) as raised:
        readers.make_loader(DATASET, 8, stream=True)
    assert isinstance(raised.value, readers.DatasetError) and raised.value.url is not None


def test_missing_credentials_are_one_line_saying_where_to_set_them(server, environment, tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("")
    no_credentials = {
        "AWS_ACCESS_KEY_ID": None,
        "AWS_SECRET_ACCESS_KEY": None,
        "AWS_SESSION_TOKEN": None,
        "AWS_PROFILE": None,
        "AWS_CONFIG_FILE": str(empty),
        "AWS_SHARED_CREDENTIALS_FILE": str(empty),
        "AWS_EC2_METADATA_DISABLED": "true",  # no instance role to ask for, here
    }
    for args in commands(SAMPLE_DATA, f"s3://{BUCKET}/new"):
        result = imgpack(*args, env=no_credentials)
        line = one_line_error(result.stderr, result.returncode)
        assert re.fullmatch(
            rf"Error: no credentials for s3://{BUCKET}/\S+ \(set AWS_\* or ~/\.aws\)", line
        )
    for name, value in no_credentials.items():
        if value is None:
            environment.delenv(name, raising=False)
        else:
            environment.setenv(name, value)
    with pytest.raises(readers.StorageError, match=f"no credentials for {DATASET}/imgpack.json"):
        readers.open_dataset(DATASET)


def test_permission_denied_is_one_line_naming_the_url(tmp_path):
    bucket = "imgpack-denied"
    url = f"s3://{bucket}/dataset"
    with local_s3_server(bucket) as guarded:
        convert_folder(SAMPLE_DATA, url, ConvertOptions("pt"), workers=1, progress=False)
        keys = guarded.enforce_permissions(
            {"reader": ["s3:ListBucket", "s3:GetObject"], "nobody": []}
        )
        # The reader may list and read, not write: refused at the journal, before any shard.
        result = imgpack(
            "convert", str(SAMPLE_DATA), f"s3://{bucket}/new", "--format", "pt", env=keys["reader"]
        )
        line = one_line_error(result.stderr, result.returncode)
        assert line == (
            f"Error: s3://{bucket}/new/{spec.JOURNAL_NAME}: permission denied (Access Denied)"
        )
        assert imgpack("info", url, env=keys["reader"]).returncode == 0
        for args in (("info", url), ("verify", url)):
            result = imgpack(*args, env=keys["nobody"])
            line = one_line_error(result.stderr, result.returncode)
            assert line.startswith(f"Error: {url}/imgpack.json: permission denied ("), line
        nobody = keys["nobody"]
        options = {"key": nobody["AWS_ACCESS_KEY_ID"], "secret": nobody["AWS_SECRET_ACCESS_KEY"]}
        with pytest.raises(readers.StorageError, match=f"{url}/imgpack.json: permission denied"):
            readers.open_dataset(url, storage_options=options)
        # A wrong secret and an unknown key are not "permission denied": the server
        # refused the credentials themselves.
        wrong_secret = {**keys["reader"], "AWS_SECRET_ACCESS_KEY": "not-the-secret"}
        unknown_key = {**keys["reader"], "AWS_ACCESS_KEY_ID": "AKIANOSUCHKEY0000000"}
        for env, code in (
            (wrong_secret, "SignatureDoesNotMatch"),
            (unknown_key, "InvalidAccessKeyId"),
        ):
            result = imgpack("info", url, env=env)
            line = one_line_error(result.stderr, result.returncode)
            prefix = f"Error: {url}/imgpack.json: the server refused the credentials ({code}: "
            assert line.startswith(prefix) and "permission denied" not in line, line


def test_a_missing_bucket_is_refused_before_the_source_is_scanned(server, tmp_path):
    missing = tmp_path / "no-such-source"  # scanning it would be the error
    result = imgpack("convert", str(missing), "s3://imgpack-no-such-bucket/x", "--format", "pt")
    line = one_line_error(result.stderr, result.returncode)
    assert line.startswith(
        "Error: s3://imgpack-no-such-bucket/x: no bucket 'imgpack-no-such-bucket'"
    )
    assert not list(Path(os.environ["IMGPACK_CACHE_DIR"], "staging").glob("*"))  # none left
    # A busy or non-empty bucket folder is refused before the scan too, naming its URL.
    result = imgpack("convert", str(missing), DATASET, "--format", "wds")
    line = one_line_error(result.stderr, result.returncode)
    assert line.startswith(f"Error: {DATASET}: folder is not empty (holds a dataset)"), line
    with pytest.raises(readers.DatasetError, match="no bucket 'imgpack-no-such-bucket'"):
        readers.open_dataset("s3://imgpack-no-such-bucket/x")


def test_a_leftover_staging_folder_does_not_block_a_new_conversion(server, tmp_path):
    staging = tmp_path / "staging"  # what a run killed before its first upload leaves
    staging.mkdir()
    (staging / spec.JOURNAL_NAME).write_text('{"journal_version": 1}\n')
    (staging / f"{spec.TMP_PREFIX}shard-000000.pt").write_bytes(b"partial")
    url = f"s3://{BUCKET}/after-leftovers"
    args = ["convert", str(SAMPLE_DATA), url, "--format", "pt", "--staging", str(staging)]
    result = imgpack(*args)
    assert result.returncode == 0, result.stderr
    assert readers.load_manifest(url).num_samples == 32
    assert not staging.exists()


def test_the_server_stopped_mid_upload_is_one_line_with_the_uploaded_count(tmp_path):
    bucket = "imgpack-outage"
    done, url = f"s3://{bucket}/done", f"s3://{bucket}/stopped"
    with local_s3_server(bucket) as outage:
        options = ConvertOptions("wds", shuffle=True)
        convert_folder(SAMPLE_DATA, done, options, workers=1, progress=False)
        dataset = readers.open_dataset(done, cache_dir=tmp_path / "cache")  # opened while up
        stream = readers.make_loader(done, 8, stream=True, num_workers=1)
        command = [sys.executable, "-m", "convert.cli", "convert", str(SAMPLE_DATA), url]
        command += ["--format", "wds", "--shard-size", "1", "--workers", "1"]
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            folder = RemoteFolder(url)
            deadline = time.monotonic() + 60
            while sum(n.endswith(".tar") for n in folder.names()) < 3:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no shard was uploaded"
                time.sleep(0.05)
            outage.stop()
            _, stderr = process.communicate(timeout=120)
        finally:
            process.kill()
            process.wait()
        line = one_line_error(stderr, process.returncode)
        cause = (
            rf"cannot reach the storage endpoint {outage.endpoint} \(connection (refused|lost)\)"
        )
        match = re.fullmatch(
            rf"Error: {url}/\S+: {cause}; (\d+) shard\(s\) are uploaded: rerun with --resume", line
        )
        assert match and int(match.group(2)) >= 2, line
        with pytest.raises(readers.StorageError, match=f"{done}/shard-000000.tar: {cause}"):
            dataset[0]
        with pytest.raises(readers.StorageError, match=cause) as raised:  # in a worker
            next(iter(stream))
        # torch rebuilds it from its traceback's text: the URL and cause read back from it
        assert raised.value.url.startswith(f"{done}/shard-"), raised.value.url
        assert re.fullmatch(cause, raised.value.cause), raised.value.cause


@contextlib.contextmanager
def misbehaving_endpoint(fault: str) -> Iterator[str]:
    """A loopback TCP server that reads each request, then closes the connection
    (``"drop"``), never answers (``"stall"``) or sends the headers of a 200 response and
    never its body (``"stall-body"``); yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # so that the loop sees ``stop``
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            request = connection.recv(65536)
            if fault == "drop":
                connection.close()
                continue
            if fault == "stall-body":
                # A HEAD's answer has no body: a byte after its headers would be read as the
                # status line of the next answer on the kept-alive connection.
                body = b"" if request.startswith(b"HEAD ") else b"{"
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + body)
            held.append(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()
        for connection in held:
            connection.close()


@pytest.mark.parametrize(("fault", "why"), [("drop", "connection lost"), ("stall", "timed out")])
def test_a_server_that_drops_or_stalls_the_connection_is_named(fault, why, monkeypatch):
    # s3fs retries each read 5 x 5 times (nested), which is 25 s of timeouts here: once
    monkeypatch.setattr(fsspec.get_filesystem_class("s3"), "retries", 1)
    with misbehaving_endpoint(fault) as endpoint:
        options = {
            "endpoint_url": endpoint,
            "key": "testing",
            "secret": "testing",
            # one attempt per request by botocore, each waiting 1 s for an answer
            "config_kwargs": {"read_timeout": 1, "retries": {"max_attempts": 1}},
        }
        cause = f"cannot reach the storage endpoint {endpoint} ({why})"
        with pytest.raises(
            readers.StorageError, match=re.escape(f"{DATASET}/imgpack.json: {cause}")
        ):
            readers.open_dataset(DATASET, storage_options=options)


STALL_S = 2  # IMGPACK_STORAGE_TIMEOUT in the stalled-server test


@pytest.mark.parametrize("fault", ["stall", "stall-body"])
def test_a_stalled_server_is_one_line_within_the_storage_timeout(fault):
    # The clients' own retries and read timeouts as they are by default (s3fs: 15 s a
    # read, 5 x 5 tries; botocore: 5): without a limit on the whole call, minutes.
    cause = (
        f"no answer from the storage server within {STALL_S} s (timed out; IMGPACK_STORAGE_TIMEOUT)"
    )
    read = (
        "import readers, sys\n"
        "try:\n"
        "    readers.open_dataset(sys.argv[1])\n"
        "except readers.StorageError as e:\n"
        "    print(e.url, e.cause, sep='|')\n"
    )
    with misbehaving_endpoint(fault) as endpoint:
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": None,
            "IMGPACK_STORAGE_TIMEOUT": str(STALL_S),
        }
        environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
        for command in (
            [sys.executable, "-m", "convert.cli", "info", DATASET],
            [sys.executable, "-c", read, DATASET],
        ):
            started = time.monotonic()
            result = subprocess.run(
                command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
            )
            elapsed = time.monotonic() - started
            if "convert.cli" in command:
                line = one_line_error(result.stderr, result.returncode)
                assert line == f"Error: {DATASET}/imgpack.json: {cause}", line
            else:
                assert result.stdout == f"{DATASET}/imgpack.json|{cause}\n", result.stderr
            assert elapsed < STALL_S + 10, elapsed  # the interpreter's start and imports


def _read_every_way(url: str, cache: Path) -> dict[str, BaseException]:
    """What each read path raises over the dataset at ``url``: the stream in this process
    and in a DataLoader worker, the map-style dataset and its loader in a worker."""
    paths = {
        "WdsStream": lambda: list(readers.WdsStream(url, shuffle_buffer=0, decode=False)),
        "stream worker": lambda: list(
            readers.make_loader(url, 8, stream=True, num_workers=1, decode=False)
        ),
        "open_dataset": lambda: [
            ds[i] for ds in [readers.open_dataset(url, cache_dir=cache)] for i in range(len(ds))
        ],
        "loader worker": lambda: list(
            readers.make_loader(url, 8, num_workers=1, cache_dir=cache, decode=False)
        ),
    }
    raised = {}
    for name, read in paths.items():
        with pytest.raises(Exception) as error:
            read()
        raised[name] = error.value
    return raised


@pytest.mark.parametrize("deleted", ["tar", "index"])
def test_a_tar_or_index_deleted_from_the_bucket_is_named_on_every_read_path(
    server, deleted, tmp_path
):
    url = f"s3://{BUCKET}/deleted-{deleted}"
    options = ConvertOptions("wds", shard_size=10, shuffle=True)
    convert_folder(SAMPLE_DATA, url, options, workers=1, progress=False)
    tar = "shard-000001.tar"
    name = tar if deleted == "tar" else tar + spec.WDS_INDEX_SUFFIX
    RemoteFolder(url).delete([name])
    if deleted == "tar":
        told = {
            "WdsStream": f"{url}/{tar}: shard listed in the manifest is missing",
            "open_dataset": f"{url}/{tar}: shard 1 listed in the manifest is missing",
        }
    else:
        told = {
            "WdsStream": f"{url}/{name}: the tar's index is missing (",
            "open_dataset": f"{url}/{name}: the index of shard 1 is missing (",
        }
    told["stream worker"], told["loader worker"] = told["WdsStream"], told["open_dataset"]
    for path, error in _read_every_way(url, tmp_path / "cache").items():
        assert isinstance(error, readers.DatasetError), (path, repr(error))
        assert told[path] in str(error), (path, str(error))
