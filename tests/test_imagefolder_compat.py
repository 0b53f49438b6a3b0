"""What code written for torchvision's ImageFolder does with an imgpack dataset: the
``imgs`` alias of ``samples``, and indices that are NumPy integers or 0-d integer tensors
(what ``Subset`` over a tensor of indices, or ``torch.randint``, hands over)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset

import readers


@pytest.mark.parametrize("fmt", list(readers.DATASETS))
def test_imgs_is_samples_as_in_imagefolder(converted, fmt):
    ds = readers.DATASETS[fmt](converted(fmt, "jpeg"))
    assert ds.imgs == ds.samples and len(ds.imgs) == len(ds)
    assert ds.imgs[7] == (ds.source_path(7), ds[7][1])


INTEGERS = {
    "0-d tensor": lambda i: torch.tensor(i),
    "0-d int32 tensor": lambda i: torch.tensor(i, dtype=torch.int32),
    "numpy int64": np.int64,
    "numpy uint8": np.uint8,
    "0-d array": np.array,
}


@pytest.mark.parametrize("kind", list(INTEGERS))
@pytest.mark.parametrize("fmt", list(readers.DATASETS))
def test_integer_scalars_of_numpy_and_torch_index_like_ints(converted, fmt, kind):
    ds = readers.DATASETS[fmt](converted(fmt, "raw-fixed"))
    index = INTEGERS[kind](3)
    image, label = ds[index]
    assert torch.equal(image, ds[3][0]) and label == ds[3][1]
    batch = ds.__getitems__([INTEGERS[kind](k) for k in (3, 5)])
    assert torch.equal(batch.images[1], ds[5][0]) and batch.labels.tolist() == [ds[3][1], ds[5][1]]
    if "tensor" in kind:  # negative, from the end, as an int would be
        assert ds[INTEGERS[kind](-1)][1] == ds[31][1]


def test_a_subset_over_a_tensor_of_indices_loads_in_a_dataloader(converted):
    ds = readers.open_dataset(converted("wds", "jpeg"), crop=readers.CenterCrop(32))
    subset = Subset(ds, torch.tensor([4, 9, 30]))
    images, labels = next(iter(DataLoader(subset, batch_size=3, collate_fn=readers.collate)))
    assert torch.equal(images[1], ds[9][0]) and labels.tolist() == [ds[k][1] for k in (4, 9, 30)]


@pytest.mark.parametrize(
    "bad", [torch.tensor([3]), torch.tensor(3.0), torch.tensor(True), np.bool_(True), np.array([3])]
)
def test_tensors_that_are_not_one_integer_are_a_type_error(converted, bad):
    ds = readers.open_dataset(converted("pt", "raw-fixed"))
    with pytest.raises(TypeError, match=r"indices must be integers.*Subset"):
        ds[bad]
