"""imgpack's converter: image folders to ``pt``/``hdf5``/``lmdb``/``wds`` datasets."""

from convert.job import BadInputError
from convert.options import ConvertOptions, ConvertResult
from convert.pipeline import convert_folder

__all__ = ["BadInputError", "ConvertOptions", "ConvertResult", "convert_folder"]
