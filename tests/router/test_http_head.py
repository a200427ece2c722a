"""``http_head``'s one-call head readers against ``httptools`` (llhttp), which they stand in for on the common shape.

Every head a reader accepts must give what ``httptools``' callbacks give for the same bytes (method or status,
target, headers as ``BareConnection`` and ``_Connection`` keep them, keep-alive, where the head ends); a head it
declines (False) goes to ``httptools`` in service, so declining is always safe, and the tests only require that
the common shapes are accepted."""

from __future__ import annotations

import random

import httptools
import pytest

from sgl_moe.router.front import http_head

pytestmark = pytest.mark.skipif(not http_head.NATIVE, reason="built without a C compiler: httptools reads every head")


class _Seen:
    def __init__(self) -> None:
        self.url, self.headers, self.done, self.keep_alive, self.parser = b"", {}, False, None, None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()


def _llhttp(data: bytes, response: bool) -> _Seen | None:
    """What httptools makes of ``data``'s head; None when it rejects it."""
    seen = _Seen()
    seen.parser = (httptools.HttpResponseParser if response else httptools.HttpRequestParser)(seen)
    try:
        seen.parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    return seen


GOOD_NAMES = ["Host", "Date", "content-type", "Connection", "Authorization", "X-Request-Id"]
GOOD_VALUES = ["x", "12", "0", "application/json", "close", "keep-alive", "Keep-Alive, Close", "Bearer k", ""]
NAMES = ["Host", "Content-Length", "content-type", "Connection", "Authorization", "X-Request-Id", "Accept",
         "User-Agent", "Transfer-Encoding", "Expect", "X-Y", "bad name", "Ünï", ""]
VALUES = ["x", "12", "0", "application/json", "close", "keep-alive", "Keep-Alive, Close", "upgrade", "Bearer k",
          "", " padded", "trailing ", "tab\there", "caf\u00e9", "a\x01b", "chunked", "1 2", "-1", "007"]


def _random_head(rng: random.Random, response: bool) -> bytes:
    good = rng.random() < 0.7  # mostly the common shape, else anything
    if good:
        first = "HTTP/1.1 200 OK" if response else "POST /generate HTTP/1.1"
    elif response:
        first = rng.choice(["HTTP/1.1 200 OK", "HTTP/1.1 503 Service Unavailable", "HTTP/1.1 404", "HTTP/1.0 200 OK",
                            "HTTP/1.1 99 X", "http/1.1 200 OK", "HTTP/1.1 204 No Content", "HTTP/1.1 200  OK"])
    else:
        first = " ".join([rng.choice(["POST", "POST", "POST", "GET", "post", "PATCH", "FOO", "P0ST"]),
                          rng.choice(["/generate", "/v1/score", "/generate?x=1", "*", "/a b", "/\u00e9", "/%20"]),
                          rng.choice(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "http/1.1"])])
    lines = [first, "Content-Length: 14"] if good and response else [first]
    for _ in range(rng.randrange(0, 7)):
        name, value = rng.choice(GOOD_NAMES if good else NAMES), rng.choice(GOOD_VALUES if good else VALUES)
        lines.append(f"{name}:{rng.choice(['', ' ', '  ', chr(9)])}{value}")
    sep = rng.choice(["\r\n"] * 12 + ["\n", "\r\n "])
    return (sep.join(lines) + "\r\n\r\n").encode("utf-8") + b'{"text": "hi"}'


@pytest.mark.parametrize("response", [False, True])
def test_an_accepted_head_reads_as_httptools_reads_it(response: bool):
    rng = random.Random(11 + response)
    read = http_head.response_head if response else http_head.request_head
    accepted = declined = 0
    for _ in range(20_000):
        data = _random_head(rng, response)
        got = read(data)
        assert got is not None  # every head here is complete
        if got is False:
            declined += 1
            continue
        accepted += 1
        seen = _llhttp(data[:data.index(b"\r\n\r\n") + 4], response)  # the head: what follows is another matter
        assert seen is not None and seen.done, data
        if response:
            status, headers, head_len, keep_alive = got
            assert status == seen.parser.get_status_code(), data
        else:
            method, target, headers, head_len, keep_alive = got
            assert method == seen.parser.get_method() and target == seen.url.decode("latin-1"), data
        assert headers == seen.headers and keep_alive == seen.keep_alive, data
        assert head_len == data.index(b"\r\n\r\n") + 4
    assert accepted > 1_000 and declined > 1_000, (accepted, declined)


def test_the_common_shapes_are_accepted_and_incomplete_heads_wait():
    request = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
               b"Connection: keep-alive\r\nUser-Agent: python-httpx/0.28.1\r\nContent-Length: 2\r\n"
               b"Content-Type: application/json\r\n\r\n{}")
    method, target, headers, head_len, keep_alive = http_head.request_head(request)
    assert (method, target, head_len, keep_alive) == (b"POST", "/generate", len(request) - 2, True)
    assert headers["content-length"] == "2" and headers["user-agent"] == "python-httpx/0.28.1"
    response = (b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 12:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\n"
                b"content-type: application/json\r\n\r\n{}")
    assert http_head.response_head(response)[0] == 200
    assert http_head.request_head(bytearray(request[:-6])) is None
    assert http_head.response_head(response[:40]) is None
    assert http_head.request_head(request.replace(b"keep-alive", b"close"))[4] is False
