"""Drop-in adapters for the training stacks users already run.

One submodule per framework, each importing its framework at module top; this package
imports none of them, so ``import trainstore.integrations`` never pulls in a framework::

    from trainstore.integrations.lightning import TrainstoreCheckpointIO   # PyTorch Lightning
    from trainstore.integrations.torchdata import StatefulSampler           # torchdata

``pyvalues`` (framework-free) turns the plain Python objects frameworks keep in their
checkpoint dicts into JSON-able values the pickle-free checkpoint format stores, and back.
"""
