"""imgpack's converter: image folders to ``pt``/``hdf5``/``lmdb``/``wds`` datasets."""

from convert.pipeline import BadInputError, ConvertOptions, ConvertResult, convert_folder

__all__ = ["BadInputError", "ConvertOptions", "ConvertResult", "convert_folder"]
