"""Catching what the native decoders print (``decode.messages``): libjpeg's warning about a
JPEG whose data ends early, written by C to descriptor 2, reaches the caller and not the
terminal, for every library that prints one and our C; anything else written meanwhile is
passed on unchanged; overlapping captures in threads each get their own call's lines; a
capture inside another does not deadlock; a process forked during one writes to the real
stderr."""
import os
import sys
import threading

import pytest

import decode
from decode import jpeg, libraries
from decode.messages import capture, is_library_line, run_captured, say_now
from tests.helpers.badcorpus import imagenet_sized_jpeg, refused_images

PREMATURE = "Corrupt JPEG data: premature end of data segment"


@pytest.fixture(scope="module")
def short():
    """A JPEG claiming 40 rows more than its data holds (libjpeg warns, the image decodes)."""
    return refused_images()["premature_end"][1]


def test_each_library_warning_is_caught_not_printed(short, capfd):
    calls = {f"{key} whole decode": (lambda key=key: (libraries.use(key),
                                                      libraries.decode_jpeg(short)))
             for key in ("torchcodec", "torchvision") if key in libraries.backends()}
    if jpeg.window.available():  # nvImageCodec's window of the missing rows
        calls["window"] = lambda: jpeg.window.decode_window(short, 380, 0, 30, 100)
    if jpeg.region.available():  # our C: declines, after printing what libjpeg said
        calls["region"] = lambda: jpeg.region.decode_region(short, 1, 380, 0, 30, 100)
    previous = libraries.decoder_key()
    try:
        for name, call in calls.items():
            with capture() as caught:
                call()
            assert caught.lines == [PREMATURE], name
    finally:
        libraries.use(previous)
    assert calls and capfd.readouterr().err == ""


def test_other_output_is_passed_on_as_written(short, capfd):
    with capture() as caught:
        print("a line of ours", file=sys.stderr, flush=True)
        os.write(2, b"progress 10%\rprogress 20%\r")
        decode.decode(short)
        os.write(2, b"tail without an end")
    assert caught.lines == [PREMATURE] and not caught.shared
    assert capfd.readouterr().err == "a line of ours\nprogress 10%\rprogress 20%\rtail without an end"


def test_overlapping_threads_each_get_their_own_lines(short):
    good = imagenet_sized_jpeg()
    found: dict[tuple[int, int], list[str]] = {}

    def work(worker: int) -> None:
        for k in range(6):
            data = short if (worker + k) % 2 else good
            found[worker, k] = run_captured(lambda: decode.decode(data))[1]

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {key: lines for key, lines in found.items()} == {
        (w, k): [PREMATURE] if (w + k) % 2 else [] for w in range(4) for k in range(6)}


def test_a_capture_inside_another_of_the_same_thread(short):
    with capture() as outer:
        _, lines = run_captured(lambda: decode.decode(short))  # no wait for itself
        with capture(exclusive=True) as inner:
            decode.decode(short)
    assert lines == inner.lines == [PREMATURE] and outer.lines == [PREMATURE] * 2


def test_a_child_forked_during_a_capture_writes_to_the_real_stderr(capfd):
    with capture():
        pid = os.fork()
        if pid == 0:
            os.write(2, b"from the child\n")
            os._exit(0)
        os.waitpid(pid, 0)
    assert capfd.readouterr().err == "from the child\n"


def test_library_lines_are_told_from_others():
    assert is_library_line(PREMATURE)
    assert is_library_line("Corrupt JPEG data: 34 extraneous bytes before marker 0xd9")
    assert is_library_line("[ERROR] [libjpeg_turbo_decoder] Could not decode jpeg code stream")
    assert is_library_line("libpng warning: iCCP: known incorrect sRGB profile")
    assert not is_library_line("warning: skipping unreadable sample x.JPEG: ...")
    assert not is_library_line("Epoch: [0][ 10/100]")


def test_say_now_reaches_stderr_during_a_capture(capfd):
    """A warning written inside a capture (a stream's retry, in a loader worker's read) is on
    standard error at once, not when the capture ends; other output waits for the end."""
    capfd.readouterr()
    with capture() as caught:
        os.write(2, b"held until the end\n")
        say_now("warning: try 2 of 5 in 1 s")
        during = capfd.readouterr().err
    after = capfd.readouterr().err
    assert during == "warning: try 2 of 5 in 1 s\n"
    assert after == "held until the end\n" and caught.lines == []
    say_now("outside")
    assert capfd.readouterr().err == "outside\n"
