"""imgpack's converter: image folders to ``pt``/``hdf5``/``lmdb``/``wds`` datasets."""

from convert.pipeline import ConvertOptions, ConvertResult, convert_folder

__all__ = ["ConvertOptions", "ConvertResult", "convert_folder"]
