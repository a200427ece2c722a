"""Router replicas sharing one picture through a broker (``--peers``): the messages, the peers' state folded into
this router's tables, and the link."""
