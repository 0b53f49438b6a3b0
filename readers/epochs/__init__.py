"""Who reads what, in which order, and where an interrupted epoch goes on: the order
(:mod:`~readers.epochs.order`), the dealing and resumable state (:mod:`~readers.epochs.state`,
in the range arithmetic of :mod:`~readers.epochs.ranges`), and the sampler, stream and loader
built on them, for the process's placement that :mod:`readers.placement` resolves."""
