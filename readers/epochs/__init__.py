"""Who reads what, in which order, and where an interrupted epoch goes on: the placement of
this process (:mod:`~readers.epochs.placement`), the order (:mod:`~readers.epochs.order`),
the dealing and resumable state (:mod:`~readers.epochs.state`, in the range arithmetic of
:mod:`~readers.epochs.ranges`), and the sampler, stream and loader built on them."""
