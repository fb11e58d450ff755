"""``python -m mcp_server.cli``: the ``outloop`` command without its console script."""

from mcp_server.cli import main

main()
