"""The HTTP front: the app and its handlers, taking a request in, forwarding it to its worker and relaying the
answer, the classify route, metrics. ``service`` is where ``POST /generate`` starts and ends."""
