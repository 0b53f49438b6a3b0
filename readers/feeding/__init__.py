"""Keeping the GPU fed: the stall meter (:mod:`~readers.feeding.wait`), the DataLoader
settings sweep (:mod:`~readers.feeding.tune`) and the device prefetcher
(:mod:`~readers.feeding.device`)."""
