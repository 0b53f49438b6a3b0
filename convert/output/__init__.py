"""Where a conversion writes, as one room.

``convert.output.destination``: the :class:`~convert.output.destination.Destination`
protocol, the local folder that implements it, and the files that finish a dataset.
``convert.output.remote``: an object-store DST, written through a locked local staging
folder and uploaded shard by shard. ``convert.output.lock``: the POSIX record lock on a
folder being written. This face imports none of them, so a process that only takes the
lock (a test's child, a second run) does not load fsspec.
"""
