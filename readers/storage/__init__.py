"""Where the bytes are: a dataset's :class:`~readers.storage.location.Location` (a local
folder, or a URL and its cache mirror), the remote folder that reaches a URL through fsspec
(and turns its faults into one-line ``StorageError``s), and the bounded local shard cache."""
