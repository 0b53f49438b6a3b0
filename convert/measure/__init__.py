"""``imgpack bench``'s measuring: read latency and throughput of datasets and image folders
(``convert.measure.bench``), and the table, plot and machine facts that report every figure
(``convert.measure.report``). The command itself is ``convert.cli.measure``."""
