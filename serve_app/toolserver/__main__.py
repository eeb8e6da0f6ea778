"""`python -m serve_app.toolserver --docs DIR --port N`: the reference tool server."""

from serve_app.toolserver.cli import main

main()
