"""The ``trainstore`` command line."""
