"""ArgvView reads SGLang's argv as argparse does for long options: both spellings, last occurrence wins."""

from sgl_moe.worker.argv import ArgvView


def test_both_spellings_and_the_last_occurrence():
    argv = ArgvView(["--port", "1", "--page-size=32", "--port=2", "--disable-cuda-graph"])
    assert argv.value("--port") == "2" and argv.value("--page-size") == "32"
    assert argv.has("--disable-cuda-graph") and argv.has("--page-size") and not argv.has("--host")
    assert argv.value("--host") is None and argv.int_value("--dp-size", default=1) == 1


def test_aliases_take_the_one_given_last():
    argv = ArgvView(["--dp-size", "2", "--data-parallel-size", "3"])
    assert argv.value("--dp-size", "--data-parallel-size") == "3"
    assert ArgvView(["--data-parallel-size", "3", "--dp-size", "2"]).value("--dp-size", "--data-parallel-size") == "2"


def test_plus_returns_a_new_view():
    argv = ArgvView(["--port", "5"])
    more = argv.plus("--page-size", "16")
    assert list(argv) == ["--port", "5"] and list(more) == ["--port", "5", "--page-size", "16"]
    assert more.value("--page-size") == "16" and not argv.has("--page-size")


def test_a_flag_at_the_end_has_no_value():
    argv = ArgvView(["--model-path"])
    assert argv.has("--model-path") and argv.value("--model-path") is None
