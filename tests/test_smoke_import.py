import trainstore


def test_import_and_version():
    assert trainstore.__version__
    assert issubclass(trainstore.errors.NotFoundError, FileNotFoundError)
