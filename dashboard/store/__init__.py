"""The store: typed SQLAlchemy 2 models, the engine/session set-up and the data-access functions.

Data-access functions are keyword-only, take the session first and raise :class:`StoreError`
subclasses with a stable ``code``; HTTP errors are raised only by the API layer.
"""
