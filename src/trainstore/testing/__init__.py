"""Test helpers shipped with the package: a real S3-protocol server on loopback."""
