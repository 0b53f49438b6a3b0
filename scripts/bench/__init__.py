"""imgpack's benchmarks, each run from the repository root as ``python -m scripts.bench.<name>``
(results and method in docs/BENCHMARKS.md):

- ``make_folder``: the ImageNet-shaped source folder the others read (``bench-data/folder``);
- ``convert``: conversion speed (workers, a plain baseline, ``--ray``, ``--large``);
- ``read``: read speed of every format through a DataLoader (``--section raw|jpeg|crops``,
  the crops in ``crops``); ``loader``: what ``make_loader`` costs, and resuming;
- ``remote``: object storage against local disk; ``memory``: peak memory;
  ``decode``: one JPEG's decode by decoder; ``sample_checks``: the per-sample checks' cost;
- ``resize_levels``: the kernel's decode and resize at each of its resize instruction levels;
- ``ab``: any rate child (``convert_rate``, ``read_rate``) on this tree and on a commit,
  side by side.

Shared: ``settings`` (constants), ``measure`` (how a run is timed), ``common`` (the rest).
"""
