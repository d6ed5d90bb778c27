"""``python -m trainstore``: the ``trainstore`` command line."""

from trainstore.cli.main import app

app(prog_name="trainstore")
