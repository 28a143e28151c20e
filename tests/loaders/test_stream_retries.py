"""Streamed shards tried again: a connection cut mid-shard or refused for a while is
reopened past the records already read, with the same records as an uninterrupted read; a
shard that fails every try stops with one line that says how many tries were made. Real HTTP
servers on 127.0.0.1; ``pipe:`` commands."""
import functools
import http.server
import os
import threading
import time

import pytest

from formats.shards.locations import Retries
from loaders import DataError
from loaders.readers.shards import ShardReader, open_reader
from tests.helpers.exits import FileServer
from tests.helpers.loading import loader_settings

QUICK = Retries(retries=2, delay=0.05)


class _CuttingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; the first GET of each ``.tar`` sends its headers and half its bytes,
    then drops the connection (a server that went away mid-transfer)."""

    cut: set = set()

    def do_GET(self):
        path = self.translate_path(self.path)
        if not path.endswith(".tar") or path in self.cut:
            return super().do_GET()
        self.cut.add(path)
        data = open(path, "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def cutting_server(tiny_shards):
    _CuttingHandler.cut = set()
    handler = functools.partial(_CuttingHandler, directory=tiny_shards)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _all_records(reader: ShardReader) -> list:
    return [reader.read(i) for i in range(len(reader))]


def _reader(location: str, retries: Retries = QUICK) -> ShardReader:
    reader = open_reader(location, loader_settings("shards"))
    reader.retries = retries
    return reader


def test_a_connection_cut_mid_shard_is_reopened_past_what_was_read(tiny_shards,
                                                                   cutting_server, capfd):
    local = _all_records(_reader(os.path.join(tiny_shards, "train")))
    remote = _all_records(_reader(f"{cutting_server}/train"))
    assert remote == local
    warnings = [l for l in capfd.readouterr().err.splitlines() if "try 2 of 3" in l]
    assert warnings and all(".tar" in l for l in warnings)  # one per shard: each was cut


def test_a_server_back_within_the_retries_loses_nothing(tiny_shards):
    local = _all_records(_reader(os.path.join(tiny_shards, "val")))
    server = FileServer(tiny_shards)
    try:
        reader = _reader(f"{server.url}/val", Retries(retries=4, delay=0.5))
        server.stop()
        restart = threading.Timer(1.0, server.start)  # down for the first two tries
        restart.start()
        started = time.monotonic()
        assert _all_records(reader) == local
        assert time.monotonic() - started >= 1.0
        restart.join()
    finally:
        server.stop()


@pytest.mark.parametrize("retries", [0, 2])
def test_a_shard_that_never_comes_back_is_one_line_naming_the_tries(tiny_shards, retries):
    server = FileServer(tiny_shards)
    reader = _reader(f"{server.url}/val", Retries(retries=retries, delay=0.05))
    server.stop()
    with pytest.raises(DataError) as failed:
        reader.read(0)
    message = str(failed.value)
    assert "\n" not in message and "cannot open" in message and "val-000000.tar" in message
    tries = retries + 1
    assert f"{tries} {'try' if tries == 1 else 'tries'} over" in message
    assert f"--shard-retries {retries}" in message


def test_a_failing_pipe_command_is_tried_again_then_one_line(tiny_shards):
    shard = os.path.join(tiny_shards, "val", "val-000000.tar")
    reader = _reader(f"pipe:cat {shard}")
    reader.urls[0] = f"pipe:cat {shard}.gone 2>/dev/null"  # no bytes, exit status 1
    with pytest.raises(DataError) as failed:
        reader.read(0)
    message = str(failed.value)
    # the command's status, or the empty tar it printed, whichever the read saw first
    assert "\n" not in message and "val-000000.tar.gone" in message
    assert "3 tries over 0.15 s" in message


def test_a_missing_http_shard_is_not_retried(tiny_shards):
    server = FileServer(tiny_shards)
    try:
        reader = _reader(f"{server.url}/val", Retries(retries=2, delay=5.0))
        reader.urls = [u.replace("val-000000", "val-missing") for u in reader.urls]
        started = time.monotonic()
        with pytest.raises(DataError, match="not found") as failed:
            reader.read(0)
        assert time.monotonic() - started < 5.0 and "tries" not in str(failed.value)
    finally:
        server.stop()
