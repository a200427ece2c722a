"""HTTP/1.1 heads of the common shape read in one C call, instead of a Python callback per part from ``httptools``.

The common shape: ``HTTP/1.1`` exactly, lines ending in CRLF, header names of token characters (each once), values
of printable ASCII or tabs without trailing spaces, no ``Connection: upgrade``; a request line ``METHOD target``
with an upper-case method and a target without spaces or controls; a status line with a 3-digit status. Each
function answers None while ``\\r\\n\\r\\n`` has not arrived, False for a head of any other shape (the caller then
parses it with ``httptools``, as before), or what ``httptools``' callbacks would have given (``http_server``'s
``BareConnection``, ``worker_client``'s ``_Connection``); ``tests/router/test_http_head.py`` holds them to it.

``NATIVE`` is False where no C compiler was found at install: the callers then parse every head with ``httptools``.
"""

from __future__ import annotations

try:
    from sgl_moe.router.front.native_http_head import request_head, response_head
    NATIVE = True
except ImportError:  # no C compiler at install
    request_head = response_head = None
    NATIVE = False

__all__ = ["NATIVE", "request_head", "response_head"]
